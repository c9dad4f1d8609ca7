"""Production path: torch + Triton implementations of the sequence-mixing ops.

One module per op (``attention``, ``rerope``, ``wkv4``, ``wkv7``, ``ssm``); each exposes one public function
with a ``backend`` argument (None: Triton for CUDA tensors, torch otherwise). Triton is optional: without it the
torch backend works. To run the Triton kernels on CPU tensors, set ``TRITON_INTERPRET=1`` before anything imports
triton.
"""
