"""ntk: NTK-Attention as a PEFT method, and the NTK theory of two papers, reproduced and checked."""

__version__ = "0.1.0"
