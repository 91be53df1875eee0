"""Baseline trainers (naive DDP, TorchRec, DeepSpeed), each on fsbench's shared model and data."""
