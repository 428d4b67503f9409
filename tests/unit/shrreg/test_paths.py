import pytest

from hami_agent.shrreg.reader import container_identity, default_root, resolve_root

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "hook,expected",
    [
        (None, "/usr/local/vgpu/containers"),
        ("/usr/local", "/usr/local/vgpu/containers"),
        ("/opt/hami/", "/opt/hami/vgpu/containers"),
        ("/usr/local/vgpu", "/usr/local/vgpu/containers"),  # HAMi vGPU monitor chart convention
    ],
)
def test_default_root(monkeypatch, hook, expected):
    monkeypatch.delenv("HOOK_PATH", raising=False)
    if hook is not None:
        monkeypatch.setenv("HOOK_PATH", hook)
    assert default_root() == expected


def test_resolve_root_prefers_dir_then_config(tmp_path, monkeypatch):
    monkeypatch.delenv("HOOK_PATH", raising=False)
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("agent:\n  hookPath: /srv/hook\n")
    assert resolve_root("/x", str(cfg)) == "/x"
    assert resolve_root(None, str(cfg)) == "/srv/hook/vgpu/containers"
    assert resolve_root(None, None) == "/usr/local/vgpu/containers"


def test_container_identity_splits_on_first_underscore():
    assert container_identity("/r/8f0c-11_main/a.cache") == ("8f0c-11", "main")
    assert container_identity("/r/_main/a.cache") is None
