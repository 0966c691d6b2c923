"""`accord bench serve`: a load generator against any OpenAI-compatible server (accord,
`vllm serve`, llama.cpp's `llama-server`, SGLang), with vLLM's `bench serve` flag names
and result-JSON keys, goodput at stated SLOs, and a sweep over arrival rates. One module
per job: the prompts (`datasets`), when they are sent (`arrivals`), one streamed request
(`client`), the figures (`metrics`), one rung (`runner`), what the server says of itself
(`server_info`), the sweep (`sweep`) and the command (`command`)."""
