"""Fixtures shared by the op families' tests."""
import pytest
import torch


@pytest.fixture
def failing_compile(monkeypatch):
    """``arrange(provider, launch, broken)``: the Inductor provider's ahead-of-time
    compile (``_compiles``, GPU only) runs on this CPU machine, ``launch.warm`` raising for the
    config ``broken`` and succeeding for the rest; no compile verdicts cached by earlier tests."""
    def arrange(provider, launch, broken):
        def warm(cfg, *args):
            if cfg == broken:
                raise RuntimeError("ptxas ran out of registers")

        provider_cls = type(provider)
        real_compiles = provider_cls._compiles

        def compiles(self, *args):  # a GPU for _compiles only: Inductor itself must keep seeing none
            with monkeypatch.context() as gpu:
                gpu.setattr(torch.cuda, "is_available", lambda: True)
                return real_compiles(self, *args)

        monkeypatch.setattr(provider_cls, "_compiles", compiles)
        monkeypatch.setattr(launch, "warm", warm)
        monkeypatch.setattr(provider, "_compiled", {})

    return arrange


@pytest.fixture
def counted_replays(monkeypatch):
    """tilefly._race_timing.replay_ms, counted: yields (the times it returned, the exceptions it raised)."""
    from tilefly import _race_timing

    replays, failed = [], []
    real = _race_timing.replay_ms

    def counted(call):
        try:
            replays.append(real(call))
        except Exception as exc:
            failed.append(exc)
            raise
        return replays[-1]

    monkeypatch.setattr(_race_timing, "replay_ms", counted)
    return replays, failed
