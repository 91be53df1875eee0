"""fsbench: a benchmark harness for distributed training of sequence-recommendation models.

Importing fsbench never imports a trainer (baselines, freescale_impl) or a trainer's
framework (torchrec, deepspeed): trainers are found by name when a run asks for them.
"""
__version__ = "0.1.0"
