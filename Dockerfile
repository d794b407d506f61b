# The OpenAI-compatible server on an NVIDIA GPU. The model is mounted, never downloaded:
#   docker build -t jaxllm .
#   docker run --gpus all -p 8000:8000 -v /path/to/models:/models jaxllm /models/Llama-3.1-8B-Instruct
# Arguments after the image name go to `jaxllm serve` (MODEL, then any flag of `jaxllm serve --help`).
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /opt/jaxllm
COPY pyproject.toml README.md ./
COPY jaxllm ./jaxllm
COPY pallas_kernels ./pallas_kernels
RUN pip install --no-cache-dir ".[gpu]"

ENV HF_HUB_OFFLINE=1
EXPOSE 8000
ENTRYPOINT ["jaxllm", "serve", "--host", "0.0.0.0", "--port", "8000"]
