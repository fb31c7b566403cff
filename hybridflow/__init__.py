"""hybridflow: RLHF post-training of LLMs on megatron-core with independent per-role meshes."""

__version__ = "0.1.0"
