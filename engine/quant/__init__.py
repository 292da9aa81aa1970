"""Expert weight formats of the residual split (WQ, WR, D4): numpy oracles.

The fast paths live in csrc/cpu (reached through engine/kernels.py); the
oracles here define the bytes and are what the native code is tested against.
"""
