"""The hardware-agnostic core, a folder per role: engine/ (requests in, outputs out),
sched/ (which tokens each request computes), executor/ and worker/ (running the model
on every rank), models/ (the graphs), model_loader/ (a model from disk), beside the
data every role shares (config, sampling params, outputs, stats). It calls kernels only
through op contracts and never imports a backend module."""
