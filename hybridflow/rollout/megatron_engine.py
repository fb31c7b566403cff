"""Native rollout: KV-cached sampling on a megatron-core GPTModel at the rollout's own TP degree.

megatron-core's StaticInferenceEngine is built around text requests, a tokenizer and CUDA-only helpers, and
its static KV cache moves by Python-int offsets (no CUDA graph); we need tensors in and tensors out on CPU
(gloo) and GPU alike, and decode steps the GPU can replay as graphs. So the model is built with the "decode"
layer spec, whose attention holds a static KV cache (`megatron_adapters.decode_cache`), and `DecodeStep`
replays one captured forward per step.

Prompts of different lengths share one batch the way static batching does it: decoding starts after the
shortest prompt, and a row still inside its own prompt is fed its prompt token instead of the sample.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hybridflow.rollout.base import EngineSetup, RolloutBatch, SamplingParams
from hybridflow.rollout.decode_step import ATTEND_BUCKET, DecodeStep, uses_graphs
from hybridflow.rollout.sampling import sample_next
from hybridflow.token_kinds import TokenKind, prompt_kinds
from megatron_adapters.bridge import TargetFormat, WeightBridge
from megatron_adapters.decode_cache import DecodeCache, attach_decode_cache, last_position_logits, new_decode_cache
from megatron_adapters.model import build_gpt, model_shape

# Reading `done` on the host synchronises with the device; on a GPU checking every few steps lets the host
# queue the next steps' kernels meanwhile (steps after every row is done write only padding).
GPU_DONE_CHECK_EVERY = 8
# When at most 1/COMPACT_FACTOR of the rows a step decodes are still unfinished, those move to the front and
# later steps decode only the first 1/COMPACT_FACTOR of the rows: responses are long-tailed (at 256 rows of a
# 46-token mean, one row can run to the 160-token limit), and the tail's steps then cost what a small batch costs.
# Row counts are batch / 4^k, so a run captures a graph for each of a few counts once (see `_decoder_for`).
COMPACT_FACTOR = 4


class MegatronRolloutEngine:
    """Generates with `model` (a GPTModel built with spec "decode", PP=1) whose tensor-parallel group is
    `tp_group`.

    vocab_size is the tokenizer's true vocabulary: the padded tail of a vocab-parallel output layer is cut
    off before sampling. `use_graphs` (default: on CUDA) captures decode steps as CUDA graphs, one per
    `attend_bucket` columns of context. `compact_factor` (0 or 1: never) is when the unfinished rows move to the
    front and decode alone (see COMPACT_FACTOR). `fuse_decode` (default: with graphs) rotates and stores each
    layer's decode token through one torch.compile'd function (`megatron_adapters.decode_cache.rotate_and_store`).
    """

    def __init__(self, model: torch.nn.Module, tp_group: dist.ProcessGroup, vocab_size: int,
                 use_graphs: bool | None = None, attend_bucket: int = ATTEND_BUCKET,
                 compact_factor: int = COMPACT_FACTOR, fuse_decode: bool | None = None):
        self.model = model
        self.fuse_decode = fuse_decode
        self.compact_factor = compact_factor
        self._decoder: tuple[tuple, DecodeCache, DecodeStep] | None = None
        self.tp_group = tp_group
        self.vocab_size = vocab_size
        self.use_graphs = use_graphs
        self.attend_bucket = attend_bucket
        self._tp_src = dist.get_global_rank(tp_group, 0)

    @torch.no_grad()
    def generate(self, batch: RolloutBatch, sampling: SamplingParams) -> RolloutBatch:
        tokens = batch.tokens.clone()
        bsz, total = tokens.shape
        device = tokens.device
        prompt_lens = batch.prompt_lens.to(device, copy=True)  # reordered in place below
        logprobs = torch.zeros(bsz, total, dtype=torch.float32, device=device)
        kinds = prompt_kinds(prompt_lens, total)
        done = torch.zeros(bsz, dtype=torch.bool, device=device)
        last_col = torch.clamp(prompt_lens + sampling.max_new_tokens, max=total)  # exclusive end per row
        stop_ids = torch.tensor(sampling.stop_token_ids, dtype=torch.long, device=device)
        generator = torch.Generator(device=device).manual_seed(sampling.seed)
        self.model.eval()

        end = int(prompt_lens.min())
        if end >= total:  # no column left to sample into
            return RolloutBatch(tokens, batch.prompt_lens, kinds, logprobs if sampling.logprobs else None)
        check_every = 1 if device.type == "cpu" else GPU_DONE_CHECK_EVERY
        # Rows are kept in "slot" order: the rows still decoding are the first `live` slots, and a decode step
        # runs on those only. order[slot] is the slot's row in `batch`; results go back in that order at the end.
        order = torch.arange(bsz, device=device)
        live = bsz
        cache, step = self._decoder_for(bsz, total, device)
        with attach_decode_cache(self.model, cache):
            positions = torch.arange(end, device=device).expand(bsz, end)
            with last_position_logits(self.model):  # prefill from column 0; only its last logits are used
                logits = self.model(tokens[:, :end], positions, None)[:, -1, :]
            while True:
                next_tok, next_logp = self._sample(logits, sampling, generator, order[:live] if live < bsz else None,
                                                   bsz)
                in_prompt = end < prompt_lens[:live]
                is_response = ~in_prompt & ~done[:live] & (end < last_col[:live])
                col = tokens[:live, end]
                col.copy_(torch.where(in_prompt | is_response, torch.where(in_prompt, col, next_tok),
                                      sampling.pad_token_id))
                logprobs[:live, end] = torch.where(is_response, next_logp, 0.0)
                kinds[:live, end] = torch.where(is_response, int(TokenKind.ASSISTANT), kinds[:live, end])
                hit_stop = is_response & torch.isin(next_tok, stop_ids)
                done[:live] |= hit_stop | (~in_prompt & (end + 1 >= last_col[:live]))
                end += 1
                if end >= total:
                    break
                if end % check_every == 0:
                    decoding = int((~done[:live]).sum())  # the one host read
                    if decoding == 0:
                        break
                    fewer = self._compacted(live, decoding)
                    if fewer < live:
                        slots = torch.argsort(done[:live].to(torch.int8), stable=True)  # decoding slots first
                        for state in (tokens, logprobs, kinds, done, prompt_lens, last_col, order):
                            state[:live] = state[:live].index_select(0, slots)
                        cache.keep_rows(slots[:fewer])
                        live = fewer
                logits = step(tokens[:live, end - 1 : end], end - 1)
        back = order.argsort()
        tokens, logprobs, kinds = tokens[back], logprobs[back], kinds[back]
        # the log-probs cost nothing here (a gather per step); dropped when not asked for, as vLLM does
        return RolloutBatch(tokens, batch.prompt_lens, kinds, logprobs if sampling.logprobs else None)

    def _compacted(self, live: int, decoding: int) -> int:
        """The rows later steps feed once `decoding` of `live` are unfinished: live / compact_factor^k for the
        largest k that still holds them, so every generation uses the same few row counts (graphs)."""
        rows = live
        while self.compact_factor > 1 and decoding * self.compact_factor <= rows:  # decoding >= 1: rows stays >= 1
            rows //= self.compact_factor
        return rows

    def _decoder_for(self, bsz: int, total: int, device: torch.device) -> tuple[DecodeCache, DecodeStep]:
        """The KV cache and decode step (with its CUDA graphs) for a batch of `bsz` x `total`, kept from the last
        generation while the weights' storage is the same (a graph reads it by address) and the batch fits: a
        smaller batch (validation's, a later turn's) decodes in the kept cache's first rows and columns, so the
        next training generation finds its graphs still there. Graphs are captured once per run, not per
        generation. The cache stays allocated in between, as the plan has it (hybridflow.placement.memory counts
        the rollout's KV cache for the whole batch beside the training roles)."""
        weights = tuple(p.data_ptr() for p in self.model.parameters())
        kept = self._decoder
        if kept is None or kept[0] != weights or kept[1].rows < bsz or kept[1].max_len < total:
            self._decoder = None  # the old buffers go before the new ones are allocated
            graphs = uses_graphs(device, self.use_graphs)
            fused = graphs if self.fuse_decode is None else self.fuse_decode
            cache = new_decode_cache(self.model, bsz, total, fused=fused)
            self._decoder = weights, cache, DecodeStep(self.model, cache, bsz, device, self.attend_bucket, graphs)
        return self._decoder[1], self._decoder[2]

    def _sample(
        self, local_logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator,
        rows: torch.Tensor | None, batch: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather the vocab-parallel logits of the last position, sample on TP rank 0, share the result.

        The random draws are made for every row of the batch (`batch`), in batch order, and the rows still
        decoding (`rows`, None = all) use theirs: moving rows to the front changes no sample."""
        world = dist.get_world_size(self.tp_group)
        if world > 1:
            parts = [torch.empty_like(local_logits) for _ in range(world)]
            dist.all_gather(parts, local_logits.contiguous(), group=self.tp_group)
            local_logits = torch.cat(parts, dim=-1)
        noise = None
        if sampling.temperature > 0:
            noise = torch.empty(batch, self.vocab_size, dtype=torch.float32, device=local_logits.device)
            noise = noise.exponential_(generator=generator)
            noise = noise if rows is None else noise.index_select(0, rows)
        tok, logp = sample_next(local_logits[:, : self.vocab_size], sampling, generator, noise)
        if world > 1:  # every TP rank drew from the same generator state; rank 0's draw is the truth
            dist.broadcast(tok, self._tp_src, group=self.tp_group)
            dist.broadcast(logp, self._tp_src, group=self.tp_group)
        return tok, logp

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        return {name: p.data for name, p in self.model.named_parameters()}

    def share_weights(self, tensors: dict[str, torch.Tensor]) -> bool:
        """Make the parameters named in `tensors` (this layout's names) these very tensors, holding no copy of
        their own: the actor's frozen base, colocated at this TP and dtype. False, changing nothing, when a name,
        shape or dtype differs."""
        params = dict(self.model.named_parameters())
        if any(name not in params or params[name].shape != t.shape or params[name].dtype != t.dtype
               or params[name].device != t.device for name, t in tensors.items()):
            return False
        for name, tensor in tensors.items():
            params[name].data = tensor
        return True

    def bucket_written(self, index: int) -> None:
        """The bridge writes straight into the model's parameters."""

    def weights_written(self) -> None:
        """Nothing to do: the weights were written in place, where the kept decode graphs read them."""

    def sleep(self) -> None:
        """Nothing to hand back: the KV cache and decode graphs stay between generations (see `_decoder_for`)."""

    def wake_up(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> None:
        """Nothing to take back (see `sleep`)."""


class MegatronBuilder:
    """Builds the native engine in this process at the rollout's TP; the bridge writes Megatron's layout into
    its parameters in place (hybridflow.engines.megatron's record names `BUILDER`)."""

    target = TargetFormat.MEGATRON
    staged = False
    adapters_from_files = False  # the actor's adapters go through the bridge into the model's own

    def start(self, setup: EngineSetup) -> None:
        """Nothing to start early: the engine is a model in this process."""

    def build(self, setup: EngineSetup, bridge: WeightBridge, started: None = None) -> MegatronRolloutEngine | None:
        if setup.groups is None:
            return None
        # with the actor's adapters (setup.lora) the layer spec carries them, so a sync can ship adapters only
        model = build_gpt(setup.hf_dir, setup.groups, head="lm", dtype=setup.dtype, spec="decode",
                          lora=setup.lora).to(setup.device)
        return MegatronRolloutEngine(model, setup.groups.tp, vocab_size=model_shape(setup.hf_dir).vocab_size)


BUILDER = MegatronBuilder()
