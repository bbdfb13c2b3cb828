"""The kernel wing: the fused step (``fused_step``, its CUDA in ``kernels.cu``), its GEMM operands
(``operands``) and cuBLAS calls (``gemm``), the NCCL all-reduce and its symmetric window
(``nccl``), and every "auto" decision of the GPU path (``policy``, which also resolves a config
into the run's StepOptions). Importing it needs no CuPy; using it does.

Imports the contracts and ``trainer.core``.
"""
