"""The dev engine's draw (``draw_one``) is ``torch.multinomial(p, 1)``: the same id for the same generator,
and the generator left in the same state, so seeded runs sample what they sampled with multinomial."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dressage.engines.sampling import draw_one  # noqa: E402

QWEN_VOCAB = 248_320


def _distributions(vocab: int, count: int, seed: int) -> list[torch.Tensor]:
    """Softmaxes of random logits at several scales, top-k-like truncations, near one-hot and uniform rows."""
    gen = torch.Generator().manual_seed(seed)
    rows: list[torch.Tensor] = []
    for i in range(count):
        logits = torch.randn(vocab, generator=gen) * (0.05 + 4.0 * (i % 9) / 8)
        probs = torch.softmax(logits, dim=-1)
        if i % 4 == 1:  # most entries zeroed, as top-k / top-p / a grammar mask leave them
            keep = probs >= torch.topk(probs, min(vocab, 1 + i % 40)).values[-1]
            probs = torch.where(keep, probs, torch.zeros_like(probs))
        elif i % 4 == 2:  # one entry holds nearly all the mass
            probs = torch.full((vocab,), 1e-9)
            probs[int(torch.randint(vocab, (1,), generator=gen))] = 1.0
        elif i % 4 == 3 and i % 8 == 3:
            probs = torch.ones(vocab)
        rows.append(probs / probs.sum())
    return rows


@pytest.mark.parametrize(("vocab", "count", "draws"), [(QWEN_VOCAB, 48, 3), (1_000, 1_500, 4), (7, 200, 20)])
def test_draw_one_picks_multinomials_id_and_leaves_the_generator_as_multinomial_does(
    vocab: int, count: int, draws: int
) -> None:
    ids_ours: list[int] = []
    ids_torch: list[int] = []
    for n, probs in enumerate(_distributions(vocab, count, seed=vocab)):
        ours, theirs = torch.Generator().manual_seed(n), torch.Generator().manual_seed(n)
        for _ in range(draws):
            ids_ours.append(draw_one(probs, ours))
            ids_torch.append(int(torch.multinomial(probs, 1, generator=theirs)))
        assert torch.equal(ours.get_state(), theirs.get_state()), f"generator states differ after row {n}"
    assert ids_ours == ids_torch
    assert len(set(ids_torch)) >= min(vocab, count // 4)  # spread draws, not one id again and again


def test_draw_one_refuses_what_multinomial_refuses() -> None:
    gen = torch.Generator().manual_seed(0)
    for bad in (
        torch.tensor([0.5, float("nan")]),
        torch.tensor([0.5, float("inf")]),
        torch.tensor([1.0, -0.1]),
    ):
        with pytest.raises(RuntimeError, match=r"inf.*nan.*element < 0"):
            draw_one(bad, gen)
        with pytest.raises(RuntimeError, match=r"inf.*nan.*element < 0"):
            torch.multinomial(bad, 1, generator=gen)
    with pytest.raises(RuntimeError, match="sum of probabilities <= 0"):
        draw_one(torch.zeros(4), gen)
