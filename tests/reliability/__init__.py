"""The reliability suite: what the server and the engine do with bad, random, concurrent and failing input.

    test_bad_requests.py   a table of distinct bad requests: each a 4xx in the OpenAI error shape, never a 5xx
                           or a hang, and the keep-alive connection serves a valid request right after
    test_fuzz_server.py    a seeded mutation fuzzer over valid completion and chat bodies (JAXLLM_FUZZ_BODIES
                           bodies): no 5xx, no hang, every error in the OpenAI shape, healthy at the end
    test_load.py           hundreds of mixed greedy requests at concurrency 16, streamed and not: all 200, each
                           output equal to the same request run alone
    test_engine_fuzz.py    the engine through its Python API (JAXLLM_ENGINE_FUZZ_STEPS steps): random arrivals
                           sharing prefixes, aborts, preemption, every sampling feature; the block pool's invariants
                           after every step, no block leaked, outputs equal to solo runs
    test_faults.py         faults injected on the engine thread (test-only hook): a failing step fails the
                           requests in flight and /health turns 503; a failing add fails that request only

Covered elsewhere, not repeated here: SIGTERM while streams run and the clean exit, the API key, body and queue
limits (tests/server/test_guards_and_shutdown.py); clients that disconnect mid-stream and the freed blocks
(tests/server/test_concurrency.py); a stalled engine step, non-streamed requests whose client leaves, and the
unexpected-error middleware (tests/server/test_engine_health.py, tests/server/test_error_middleware.py).
"""
