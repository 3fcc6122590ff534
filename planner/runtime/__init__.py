"""The runtime: execute a Plan under torchrun with torch.distributed (gloo on CPU, NCCL on GPU).

Modules, one job each: ``options`` (flags), ``model`` (load, cast, fingerprint a workload),
``check`` (plan vs model and world, before compute), ``topology`` (placement and groups),
``stage`` (the stage module: layer range, recompute, emulation), ``memory`` (bytes saved for
backward), ``emulate`` (sleeping layers), ``grads`` (data-parallel and tied gradients),
``engine`` (one rank's training loop on ``torch.distributed.pipelining``), ``checkpoint``,
``collect`` (RunReport), ``main`` (process lifecycle). This package imports torch; nothing
outside ``planner.runtime`` imports it.
"""
