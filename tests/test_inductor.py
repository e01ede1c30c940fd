"""tilefly._inductor: the InductorChoices subclass, its install/uninstall, when it asks
providers for candidates, and that nothing changes for users who do not name TILEFLY."""
import pickle

import pytest

pytest.importorskip("torch._inductor")

from torch._inductor import config as inductor_config  # noqa: E402

from tilefly import _inductor, config  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_install():
    _inductor.uninstall()
    yield
    _inductor.uninstall()


class RecordingProvider:
    name = "recording"

    def __init__(self, answer=("choice",), fail=False):
        self.answer, self.fail = list(answer), fail
        self.prepared = 0
        self.asked = []

    def prepare(self):
        self.prepared += 1

    def candidates(self, kernel_inputs, op_name):
        self.asked.append(op_name)
        if self.fail:
            raise RuntimeError("provider bug")
        return self.answer


@pytest.fixture
def provider(monkeypatch):
    p = RecordingProvider()
    monkeypatch.setitem(_inductor._providers, "fake_op", [p])
    monkeypatch.setattr(_inductor, "_enabled", {"recording"})
    return p


def test_install_sets_and_restores_the_choices_class():
    assert inductor_config.inductor_choices_class is None
    _inductor.install()
    _inductor.install()
    assert inductor_config.inductor_choices_class is _inductor.TileflyChoices
    assert _inductor.installed()
    _inductor.uninstall()
    _inductor.uninstall()
    assert inductor_config.inductor_choices_class is None and not _inductor.installed()


def test_install_leaves_another_choices_class_alone(caplog):
    from torch._inductor.choices import InductorChoices

    class Theirs(InductorChoices):
        def uuid(self):
            return "theirs"

    # Inductor's config.patch, not monkeypatch: pytest >= 9.2 undoes a setattr on a module
    # with delattr, which hides the option from Inductor's config module for the session.
    with inductor_config.patch(inductor_choices_class=Theirs):
        _inductor.install()
        assert inductor_config.inductor_choices_class is Theirs and not _inductor.installed()
    assert "already" in caplog.text


def test_install_prepares_registered_providers(provider):
    _inductor.install()
    assert provider.prepared == 1
    late = RecordingProvider()
    _inductor.register_candidates("fake_op", late)
    assert late.prepared == 1, "a family imported after enable() is prepared at once"


def test_choices_class_has_a_uuid_and_pickles_by_reference():
    cls = _inductor.TileflyChoices
    uuid = cls().uuid()
    assert isinstance(uuid, str) and uuid.startswith("tilefly-choices")
    assert pickle.loads(pickle.dumps(cls)) is cls


def test_uuid_changes_with_the_search_space(monkeypatch):
    default = _inductor.TileflyChoices().uuid()
    monkeypatch.setattr(config, "gemm_autotune", "exhaustive")
    assert _inductor.TileflyChoices().uuid() != default


@pytest.mark.parametrize("patch, wanted", [
    (dict(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON,TILEFLY"), True),
    (dict(max_autotune_gemm=True, max_autotune_gemm_backends="aten, tilefly"), True),
    (dict(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON"), False),
    (dict(max_autotune=False, max_autotune_gemm=False, max_autotune_gemm_backends="ATEN,TILEFLY"), False),
])
def test_requested_needs_max_autotune_and_the_backend_name(patch, wanted):
    with inductor_config.patch(patch):
        assert _inductor.requested() is wanted


def test_disable_turns_candidates_off(monkeypatch):
    monkeypatch.setattr(config, "disable", True)
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="TILEFLY"):
        assert not _inductor.requested()


def test_providers_are_asked_only_when_requested(provider):
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON"):
        assert _inductor._extra_choices(object(), "fake_op") == []
    assert provider.asked == []
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON,TILEFLY"):
        assert _inductor._extra_choices(object(), "fake_op") == ["choice"]
        assert _inductor._extra_choices(object(), "other_op") == []
    assert provider.asked == ["fake_op"]


def test_a_registered_family_offers_nothing_until_enabled(provider):
    # importing a family (explain() imports them all) registers its provider; enable() chooses
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="TILEFLY"):
        _inductor._enabled.clear()
        assert _inductor._extra_choices(object(), "fake_op") == [] and provider.asked == []
        _inductor.install(["recording"])
        assert _inductor._extra_choices(object(), "fake_op") == ["choice"]
        _inductor.uninstall(["other"])
        assert _inductor.installed() and _inductor._extra_choices(object(), "fake_op") == ["choice"]
        _inductor.uninstall(["recording"])
        assert not _inductor.installed() and _inductor._extra_choices(object(), "fake_op") == []


def test_a_failing_provider_never_breaks_compilation(monkeypatch, caplog):
    monkeypatch.setitem(_inductor._providers, "fake_op", [RecordingProvider(fail=True)])
    monkeypatch.setattr(_inductor, "_enabled", {"recording"})
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="TILEFLY"):
        assert _inductor._extra_choices(object(), "fake_op") == []
    assert "provider bug" in caplog.text


def test_get_template_configs_appends_candidates(provider, monkeypatch):
    from torch._inductor.choices import InductorChoices

    seen = {}

    def base(self, kernel_inputs, templates, op_name, kwarg_overrides=None):
        seen[op_name] = list(templates)
        return []

    monkeypatch.setattr(InductorChoices, "get_template_configs", base)
    choices = _inductor.TileflyChoices()
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,TILEFLY"):
        choices.get_template_configs(object(), ["aten"], "fake_op")
    assert seen["fake_op"] == ["aten", "choice"]
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN"):
        choices.get_template_configs(object(), ["aten"], "fake_op")
    assert seen["fake_op"] == ["aten"]


def test_install_replaces_a_handler_inductor_already_cached():
    from torch._inductor.choices import InductorChoices
    from torch._inductor.virtualized import V

    assert type(V.choices) is InductorChoices        # built and cached for this thread
    _inductor.install()
    assert isinstance(V.choices, _inductor.TileflyChoices)
    _inductor.uninstall()
    assert type(V.choices) is InductorChoices
