"""Imported first by the fork server that forks CPU ranks (`set_forkserver_preload`), before the entrypoint's
module: the known third-party warnings that module's imports raise there (torch's CUDA notice, megatron-core's
Apex/Transformer Engine fallbacks) are dropped. The launching process imported the same modules, said each
once and keeps the full text in its warnings file; the fork server's stderr is the launcher's console."""

from hybridflow.launch.known_warnings import quiet_known_noise

quiet_known_noise(show=False)
