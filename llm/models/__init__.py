"""Model families, one file each; `registry.py` maps HF `architectures` strings to them."""
