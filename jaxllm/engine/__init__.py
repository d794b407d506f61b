"""The continuous-batching engine: host-side request state, block pool, scheduler; the runner owns the device."""
