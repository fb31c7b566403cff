"""The native engine's own weight copy goes back to the device when it starts reading the actor's tensors: torch's
cache is emptied on the first successful share only (with CUDA), not on later syncs nor when sharing fails."""

from types import SimpleNamespace

import torch

from hybridflow.roles.rollout_role import RolloutRole


class _Engine:
    def __init__(self, accepts: bool):
        self.accepts, self.calls = accepts, 0

    def share_weights(self, tensors):
        self.calls += 1
        return self.accepts


def _role(accepts: bool) -> RolloutRole:
    plan = SimpleNamespace(colocated=True, gen=SimpleNamespace(tp=2), train=SimpleNamespace(tp=2, pp=1))
    return RolloutRole(mesh=None, engine=_Engine(accepts), bridge=SimpleNamespace(plan=plan), sampling=None,
                       device=torch.device("cpu"), shares_actor_weights=True)


def test_cache_is_emptied_once_at_the_first_share(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    src = {"w": torch.zeros(2)}
    role = _role(accepts=True)
    assert role._share(src) and role._share(src) and role._share(src)  # full fine-tuning: every sync shares
    assert len(emptied) == 1 and role.weights_shared
    refused = _role(accepts=False)  # another layout or dtype: the engine keeps its copy, nothing to release
    assert not refused._share(src) and emptied == [1] and not refused.weights_shared


def test_without_cuda_nothing_is_emptied(monkeypatch):
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: (_ for _ in ()).throw(AssertionError("called")))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    role = _role(accepts=True)
    assert role._share({"w": torch.zeros(2)}) and role.weights_shared
