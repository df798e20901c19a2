"""Tensor parallelism: process groups, parallel layers, AllReduce backends."""
