"""odesolve's benchmark: workloads W1-W7 (benchmarks/README.md), side by side with Diffrax,
`jax.experimental.ode`, torchdiffeq and torchode (when installed) and a fixed-step
`lax.scan` limit, in one process.

    python -m odesolve.bench            # quick CPU sizes, a few minutes at most
    python -m odesolve.bench --full     # the stated sizes
    python -m odesolve.bench --only W2,W4 --out DIR

Modules, one concern each: `_problems` (the equations), `_workloads` (W1-W7 as specs and
their targets), `_peers` (which libraries, how to install them, adapters), `_torch` (the
PyTorch peers' adapters, imported only when one is installed), `_limit` (the fixed-step
scan), `_reference` (tight scipy solutions), `_measure` (compile, time, memory), `_run`
(selection and order), `_device` (`--device`), `_header` (the run's opening lines:
device, versions, peers), `_report` (table, JSON, plot), `_kernels` (kernels per step from
the compiled HLO), `_w10` (the small-field ensemble). On a GPU, `benchmarks/gpu.sh` runs
`_gpu` (stages within a time budget), `_device_check` (GPU against the CPU backend) and
`_sweep` (ensemble scaling).
"""
