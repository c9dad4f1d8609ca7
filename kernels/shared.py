"""What the packages above kernels/ (models, conformance, benchmarks) use of the kernels' private helpers, under
public names: input checks, dtypes and output buffers (``_common``) and the flash kernels' head tile (``_flash``).

The kernels themselves import these from the private modules; another package imports them from here, so that no
private (``_``) name crosses a package (tests/repository/test_packaging.py checks it).
"""
from __future__ import annotations

from ._common import (TORCH_DTYPES, accumulation_dtype, check_devices, check_tensor, needs_grad,
                      new_output)
from ._flash import block_d

__all__ = ["TORCH_DTYPES", "accumulation_dtype", "check_devices", "check_tensor", "needs_grad", "new_output",
           "block_d"]
