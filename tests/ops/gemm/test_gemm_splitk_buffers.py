"""Split-K partials and tickets: one kept pair per (device, stream) for eager launches; under CUDA
graph capture fresh partials and tickets sliced from a zeroed arena, never handed out twice (CPU:
the device calls are stood in for; the GPU tests replay captured graphs)."""
import pytest
import torch

from tilefly.ops.gemm import launch

CPU = torch.device("cpu")


@pytest.fixture
def buffers(monkeypatch):
    monkeypatch.setattr(launch._device, "kept", lambda make, device: make())
    monkeypatch.setattr(launch._triton_launch, "current_stream", lambda index: 0)
    monkeypatch.setattr(launch, "_buffers", {})
    monkeypatch.setattr(launch, "_retired", [])
    monkeypatch.setattr(launch, "_ticket_arenas", {})
    monkeypatch.setattr(launch, "TICKET_ARENA_INTS", 256)


def test_a_capture_before_any_eager_launch_gets_tickets_zeroed_in_the_graph(buffers):
    partials, tickets = launch.splitk_buffers(CPU, 100, 10, capturing=True)
    assert partials.numel() == 100 and partials.dtype == torch.float32
    assert tickets.numel() == 10 and not tickets.any() and tickets.untyped_storage().nbytes() == 40
    assert launch._ticket_arenas == {} and launch._buffers == {}


def test_captured_launches_get_disjoint_zero_slices_of_the_arena(buffers):
    launch.splitk_buffers(CPU, 100, 10, capturing=False)       # eager: the pair and the arena
    arena, used = launch._ticket_arenas[CPU.index]
    assert arena.numel() == 256 and not arena.any() and used == 0
    slices = [launch.splitk_buffers(CPU, 100, tiles, capturing=True)[1] for tiles in (10, 40, 1)]
    base = arena.data_ptr()
    starts = [(t.data_ptr() - base) // 4 for t in slices]
    assert [t.numel() for t in slices] == [10, 40, 1]
    assert starts == [0, 32, 96]                                  # 32-int (128-byte) steps, never reused
    assert all(t.untyped_storage().data_ptr() == arena.untyped_storage().data_ptr() for t in slices)
    assert not any(t.any() for t in slices)
    assert launch._ticket_arenas[CPU.index][1] == 128
    eager = launch.splitk_buffers(CPU, 100, 10, capturing=False)[1]
    assert eager.untyped_storage().data_ptr() != arena.untyped_storage().data_ptr()  # eager pair apart


def test_a_spent_arena_falls_back_to_tickets_zeroed_in_the_graph(buffers):
    launch.splitk_buffers(CPU, 8, 8, capturing=False)
    arena = launch._ticket_arenas[CPU.index][0]
    first = launch.splitk_buffers(CPU, 8, 200, capturing=True)[1]
    assert first.untyped_storage().data_ptr() == arena.untyped_storage().data_ptr()
    late = launch.splitk_buffers(CPU, 8, 100, capturing=True)[1]  # 224 + 100 > 256
    assert late.untyped_storage().data_ptr() != arena.untyped_storage().data_ptr() and not late.any()
    small = launch.splitk_buffers(CPU, 8, 32, capturing=True)[1]  # still fits: 224 + 32
    assert small.untyped_storage().data_ptr() == arena.untyped_storage().data_ptr()


def test_the_arena_is_made_once_a_device(buffers):
    launch.splitk_buffers(CPU, 8, 8, capturing=False)
    arena = launch._ticket_arenas[CPU.index][0]
    launch.splitk_buffers(CPU, 1 << 12, 1 << 13, capturing=False)    # outgrown pair: regrown
    assert launch._ticket_arenas[CPU.index][0] is arena and len(launch._retired) == 1
