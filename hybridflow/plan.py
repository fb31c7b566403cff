"""`python -m hybridflow.plan +experiment=NAME [key=value ...] [--out PATH]`: print the placement plan and
per-GPU memory table and the predicted step time (the auto search's cost model, also for explicit plans),
write it as JSON (default ./plan.json), and print the command that runs it. Needs no GPU."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from hybridflow.algorithms import check_algorithm
from hybridflow.config import split_argv
from hybridflow.data.vocabulary import check_run_tokens, stop_ids_source
from hybridflow.engines import AUTO
from hybridflow.errors import cli_errors
from hybridflow.launch.command_help import config_parser, job_config_yaml, parse_config_args
from hybridflow.placement import plan_placement
from hybridflow.placement.auto import search_placement
from hybridflow.placement.auto.explain import overlap_text
from hybridflow.placement.auto.from_config import plan_candidate
from hybridflow.placement.engine_choice import choose_engine
from hybridflow.placement.report import format_plan
from hybridflow.resolve import resolve_experiment


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = config_parser("python -m hybridflow.plan", __doc__)
    parser.add_argument("--out", default="plan.json", help="where to write the plan as JSON (default ./plan.json)")
    return parse_config_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with cli_errors():
        cfg = resolve_experiment(*split_argv(args.overrides))
        check_algorithm(cfg)  # what the algorithm needs from the run (its record), before planning
        if args.cfg:
            print(job_config_yaml(cfg), end="")
            return 0
        explanation, choice = None, None
        if cfg.rollout.engine == AUTO:  # every engine planned, the faster kept; it says why
            choice = choose_engine(cfg)
            cfg, plan, explanation = choice.config, choice.plan, choice.explanation
        elif cfg.placement.mode == "auto":  # the search also explains itself: stage times and runners-up
            plan, explanation = search_placement(cfg)
        else:
            plan = plan_placement(cfg)
        stops = check_run_tokens(cfg).stop_token_ids  # the tokenizer against model.vocab_size, and the stop ids
    print(
        f"experiment: {cfg.name}  model: {cfg.model.architecture} h={cfg.model.hidden_size} "
        f"L={cfg.model.num_hidden_layers}  cluster: {cfg.cluster.gpu_type}"
    )
    print(format_plan(plan))
    if choice is not None:
        print(choice.format())
    print(f"rollout stops at token ids {list(stops)} ({stop_ids_source(cfg)})" if stops else
          f"rollout never stops early ({stop_ids_source(cfg)}): every response is "
          f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} tokens")
    if explanation is not None:
        print("\n" + explanation.format())
        stage_s = explanation.stage_s
    else:
        predicted = plan_candidate(cfg, plan)
        stage_s = dict(predicted.stage_times)
        stages = ", ".join(f"{name} {t:.1f} s" for name, t in stage_s.items())
        print(f"\npredicted step time: {predicted.total:.1f} s ({stages}; cost model for "
              f"{cfg.cluster.gpu_type})")
        if predicted.overlap is not None:
            print(f"  one step off (trainer.rollout_lag=1): {overlap_text(predicted.overlap)}")
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"experiment": cfg.name, **plan.to_json(), "predicted_stage_s": stage_s,
                               "stop_token_ids": list(stops),
                               "predicted_step_s": explanation.total_s if explanation else predicted.total,
                               **({"auto": explanation.to_json()} if explanation else {}),
                               **({"engine_choice": choice.to_json()} if choice else {})}, indent=1))
    print(f"wrote {out}")
    print("next: " + shlex.join(["python", "-m", "hybridflow.run", *args.overrides]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
