"""The hardware-agnostic core: config, block manager, scheduler, model runner,
sampler, engine and model graphs. It calls kernels only through op contracts and
never imports a backend module."""
