"""Hugging Face checkpoints with group-quantised integer weights (compressed-tensors'
pack-quantized, AWQ, GPTQ): the scheme read from config.json's quantization_config,
each format's tensors converted to group_quant_linear's layout, and the checkpoint view
that hands them to the weight loader packed."""
