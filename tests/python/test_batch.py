"""Many sequences per call (include/dsv4/engine.h: dsv4_engine_forward_batch, dsv4_engine_step) and the
sequence operations (copy, truncate, continuing a sequence), against each sequence run alone.

The rule is exactness: after a batched call every sequence's logits, MTP logits and exported caches
and states (SWA rings, compressed and indexer caches, compressor states, the MTP ring) are the bytes
it gets when it runs alone, token by token or in one prefill, for any mix of sequences, lengths,
order and thread count (the alone runs use 1 thread, the batched ones 2). Models: the built-in
tiny checkpoint (window 16, CSA ratio 4 with a top-4 indexer, HCA ratio 8, MTP), its vocabulary-8
variant whose MTP block echoes the main prediction (drafts get accepted), and the Hugging Face
checkpoint hf-tiny-a (window 16, HCA 8 and CSA 4, no MTP weights), and tiny's layers re-rated in
transformers' naming (a CSA layer of ratio 8; CSA and HCA layers of ratio 2 sharing a page pool).
Lengths cross the window, compression block and indexer boundaries; chunks are shorter than the
prompts (max_batch 16)."""
import os

import numpy as np
import pytest

import dsv4
import oracles as o
import ref_checkpoint as rc
from dsv4.engine import Engine, rng_seed
from test_engine import _write_rates_variant, _write_variant

SEED = int(os.environ.get("DSV4_TEST_SEED", np.random.SeedSequence().entropy % (1 << 32)))
HF_TINY = os.path.join(o.TESTDATA, "hf-tiny-a")


@pytest.fixture(scope="module")
def rng():
    print(f"test_batch seed {SEED} (DSV4_TEST_SEED to replay)")
    return np.random.default_rng(SEED)


@pytest.fixture(scope="module")
def paths(tmp_path_factory, rng):
    root = tmp_path_factory.mktemp("batch-models")
    tiny = str(root / "tiny")
    dsv4.model.make_tiny(tiny, seed=int(rng.integers(1 << 30)))
    base = rc.Checkpoint(tiny)
    vocab8 = _write_variant(base, str(root / "vocab8"), vocab=8, echo=True)
    csa8 = _write_rates_variant(base, str(root / "csa8"), [0, 1, 2], {"csa": 8, "hca": 4}, rng)
    r2 = _write_rates_variant(base, str(root / "hca2-csa2"), [2, 1], {"csa": 2, "hca": 2}, rng)
    return {"tiny": (tiny, 512), "hf": (HF_TINY, 512), "vocab8": (vocab8, 8), "csa8": (csa8, 512), "r2": (r2, 512)}


def mt(e, n):
    """n MTP logits rows where the checkpoint has an MTP block (hf-tiny-a has none), else 0."""
    return n if e.options["max_mtp"] else 0


def alone(path, prompt, singles, max_mtp=1):
    """Logits and MTP logits of every position (prompt in one call, then one token per call), and
    the export, on an engine with one sequence and one thread."""
    with Engine(path, max_context=256, max_seqs=1, max_batch=128, max_mtp=max_mtp, threads=1) as e:
        s = e.seq_create()
        lg, ml = e.forward(s, prompt, n_mtp_logits=mt(e, len(prompt) - 1))
        lgs, mls = [lg], [ml]
        for t in singles:
            a, b = e.forward(s, [t], n_mtp_logits=mt(e, 1))
            lgs.append(a)
            mls.append(b)
        return np.concatenate(lgs), np.concatenate(mls), e.export(s)


@pytest.mark.parametrize("name", ["tiny", "hf", "csa8", "r2"])
def test_batch_equals_alone(paths, rng, name):
    """Four sequences of prompt lengths 37 / 3 / 20 / 58 prefilled in one call (in random entry order,
    split over chunks of 16 rows), then rounds in which a random subset, in random order, appends
    1-3 tokens: each sequence's logits, MTP logits and cache bytes equal its alone run."""
    path, vocab = paths[name]
    lens, rounds = [37, 3, 20, 58], 10
    prompts = [rng.integers(0, vocab, n) for n in lens]
    extra = [list(rng.integers(0, vocab, 3 * rounds)) for _ in lens]
    got_lg = [[] for _ in lens]
    got_ml = [[] for _ in lens]
    used = [0] * len(lens)
    with Engine(path, max_context=256, max_seqs=4, max_batch=16, max_mtp=1, threads=2) as e:
        seqs = [e.seq_create() for _ in lens]
        order = rng.permutation(len(lens))
        out = e.forward_batch([(seqs[i], prompts[i], None, mt(e, lens[i] - 1)) for i in order])
        for i, (lg, ml) in zip(order, out):
            got_lg[i].append(lg)
            got_ml[i].append(ml)
        for _ in range(rounds):
            pick = [i for i in rng.permutation(len(lens)) if rng.random() < 0.7] or [0]
            ents = []
            for i in pick:
                n = int(rng.integers(1, 4))
                toks = extra[i][used[i]:used[i] + n]
                used[i] += n
                ents.append((seqs[i], toks, None, mt(e, n)))
            for i, (lg, ml) in zip(pick, e.forward_batch(ents)):
                got_lg[i].append(lg)
                got_ml[i].append(ml)
        exports = [e.export(s) for s in seqs]
    for i in range(len(lens)):
        lg, ml, ex = alone(path, prompts[i], extra[i][:used[i]])
        assert np.array_equal(np.concatenate(got_lg[i]), lg), f"sequence {i}: logits"
        assert np.array_equal(np.concatenate(got_ml[i]), ml), f"sequence {i}: MTP logits"
        assert np.array_equal(exports[i], ex), f"sequence {i}: caches and states"


def run_alone(path, prompt, n, mtp, temperature, seed):
    with Engine(path, max_context=256, max_seqs=1, max_batch=32, max_mtp=3, threads=1) as e:
        toks, st, _ = e.generate(prompt, n, mtp=mtp, temperature=temperature, seed=seed)
        return toks, st


@pytest.mark.parametrize("name", ["tiny", "vocab8"])
def test_step_batched_speculative(paths, rng, name):
    """dsv4_engine_step over three sequences at once, each with its own draft length (0, 2, 3) and
    sampling: every sequence produces the tokens it produces alone with dsv4_engine_generate (same
    seed, same drafts), greedy MTP equals plain greedy, and on the echoing model drafts are accepted
    inside the batch."""
    path, vocab = paths[name]
    cfgs = [(0, 0.0), (2, 0.0), (3, 0.0), (2, 0.9)]
    n_new = 20
    prompts = [rng.integers(0, vocab, int(rng.integers(3, 30))) for _ in cfgs]
    seeds = [int(rng.integers(1 << 30)) for _ in cfgs]
    got = [[] for _ in cfgs]
    accepted = 0
    with Engine(path, max_context=256, max_seqs=4, max_batch=32, max_mtp=3, threads=2) as e:
        seqs = [e.seq_create() for _ in cfgs]
        rngs = [rng_seed(s) for s in seeds]
        for i in range(len(cfgs)):  # prompts one step each (a step's rows fit max_batch)
            got[i] += list(e.step([{"seq": seqs[i], "tokens": prompts[i], "temperature": cfgs[i][1], "rng": rngs[i]}])[0][0])
        while any(len(g) < n_new for g in got):
            live = [i for i in range(len(cfgs)) if len(got[i]) < n_new]
            reqs = [{"seq": seqs[i], "tokens": [got[i][-1]], "mtp": min(cfgs[i][0], n_new - len(got[i]) - 1),
                     "temperature": cfgs[i][1], "rng": rngs[i]} for i in live]
            for i, (toks, d, a) in zip(live, e.step(reqs)):
                assert 1 <= len(toks) <= d + 1 and a == len(toks) - 1
                got[i] += list(toks)
                accepted += a
    for i, (k, temp) in enumerate(cfgs):
        want, _ = run_alone(path, prompts[i], n_new, k, temp, seeds[i])
        assert np.array_equal(np.array(got[i][:n_new]), want), f"request {i} (mtp {k}, T {temp})"
        if temp == 0.0 and k:
            plain, _ = run_alone(path, prompts[i], n_new, 0, 0.0, 0)
            assert np.array_equal(want, plain)
    if name == "vocab8":
        assert accepted > 0
    print(f"{name}: {accepted} drafts accepted in batched steps")


def test_copy_shares_a_prefix(paths, rng):
    """A prompt computed once and copied into two sequences, which then diverge: each equals a fresh
    run of its whole token list (logits of the continuation and cache bytes), and the source is
    untouched by the copies' progress."""
    path, vocab = paths["hf"]
    prompt = rng.integers(0, vocab, 45)
    tails = [list(rng.integers(0, vocab, 9)) for _ in range(2)]
    with Engine(path, max_context=256, max_seqs=3, max_batch=16, max_mtp=1, threads=2) as e:
        a = e.seq_create()
        e.forward(a, prompt, n_logits=0)
        before = e.export(a)
        b, c = e.seq_create(), e.seq_create()
        e.forward(b, [1, 2, 3], n_logits=0)  # dst had content: overwritten
        e.seq_copy(a, b)
        e.seq_copy(a, c)
        assert np.array_equal(e.export(b), before)
        assert np.array_equal(e.seq_tokens(c), prompt)
        outs = e.forward_batch([(b, tails[0], None, mt(e, 9)), (c, tails[1], None, mt(e, 9))])
        assert np.array_equal(e.export(a), before)
        got = [e.export(b), e.export(c)]
    for j in range(2):
        lg, ml, ex = alone(path, prompt, tails[j])
        assert np.array_equal(outs[j][0], lg[len(prompt):])
        assert np.array_equal(outs[j][1], ml[len(prompt) - 1:])
        assert np.array_equal(got[j], ex)


@pytest.mark.parametrize("name,max_mtp", [("tiny", 2), ("hf", 1), ("tiny", 0), ("csa8", 1), ("r2", 0)])
def test_truncate_is_exact(paths, rng, name, max_mtp):
    """Truncate a 70-token sequence to lengths on and off the compression boundaries (8 = a block of
    every ratio, 33, 47, 64, 69) and to 0, then feed a new tail: the caches, states and logits equal a
    sequence that only ever saw the kept tokens and the tail. Short cuts recompute at most
    lcm(ratios) + the largest CSA ratio tokens; long ones (whose window left the ring) recompute from
    position 0."""
    path, vocab = paths[name]
    ids = rng.integers(0, vocab, 70)
    tail = list(rng.integers(0, vocab, 6))
    for keep in (69, 64, 47, 33, 8, 0):
        with Engine(path, max_context=256, max_seqs=2, max_batch=16, max_mtp=max_mtp, threads=2) as e:
            s = e.seq_create()
            e.forward(s, ids, n_logits=0)
            n = e.seq_truncate(s, keep)
            assert e.seq_length(s) == keep and np.array_equal(e.seq_tokens(s), ids[:keep])
            assert n <= keep
            if keep >= 64:
                assert n <= 8 + (8 if name == "csa8" else 4), f"keep {keep}: recomputed {n}"
            nm = mt(e, len(tail) - (keep == 0))
            lg, ml = e.forward(s, tail, n_mtp_logits=nm)
            got = e.export(s)
        with Engine(path, max_context=256, max_seqs=2, max_batch=16, max_mtp=max_mtp, threads=1) as e:
            s = e.seq_create()
            if keep:
                e.forward(s, ids[:keep], n_logits=0)
            lg2, ml2 = e.forward(s, tail, n_mtp_logits=nm)
            want = e.export(s)
        assert np.array_equal(lg, lg2), f"keep {keep}: logits"
        assert np.array_equal(ml, ml2), f"keep {keep}: MTP logits"
        assert np.array_equal(got, want), f"keep {keep}: caches and states"


def test_generate_continues_a_conversation(paths, rng):
    """A second generate on the same sequence (a new turn: the last returned token, then the new user
    tokens) gives what a fresh generate over the whole conversation gives, with and without MTP."""
    path, vocab = paths["vocab8"]
    p1, p2 = list(rng.integers(0, vocab, 12)), list(rng.integers(0, vocab, 5))
    for mtp in (0, 2):
        with Engine(path, max_context=256, max_seqs=2, max_batch=32, max_mtp=3, threads=1) as e:
            s = e.seq_create()
            a, _, _ = e.generate(p1, 10, mtp=mtp, seq=s)
            b, _, _ = e.generate([int(a[-1])] + p2, 10, mtp=mtp, seq=s)
            assert e.seq_length(s) == len(p1) + 10 + len(p2) + 9
            fresh, _, _ = e.generate(p1 + list(a) + p2, 10, mtp=0)
        assert np.array_equal(b, fresh), f"mtp {mtp}"


def test_bad_batches_change_nothing(paths, rng):
    """A sequence named twice, an unknown or failed sequence, a token out of range, a call past
    max_context, too many logits rows, a step past max_batch or with drafts on an empty sequence:
    each is refused with a message before anything runs, and every sequence's bytes stay."""
    path, vocab = paths["tiny"]
    with Engine(path, max_context=64, max_seqs=3, max_batch=16, max_mtp=2, threads=2) as e:
        a, b = e.seq_create(), e.seq_create()
        e.forward_batch([(a, rng.integers(0, vocab, 20), 0), (b, rng.integers(0, vocab, 7), 0)])
        snap = [e.export(a), e.export(b)]
        bad = [
            ([(a, [1], 1), (b, [2], 1), (a, [3], 1)], "twice"),
            ([(a, [1], 1), (2, [2], 1)], "does not exist"),
            ([(a, [1], 1), (b, [vocab], 1)], "outside the vocabulary"),
            ([(b, [1], 1), (a, list(range(45)), 1)], "exceed max_context"),
            ([(a, [1, 2], 3)], "n_logits"),
            ([(a, [1], 1, 5)], "n_mtp_logits"),
        ]
        for ents, msg in bad:
            with pytest.raises(dsv4.DSV4Error, match=msg):
                e.forward_batch(ents)
            assert np.array_equal(e.export(a), snap[0]) and np.array_equal(e.export(b), snap[1])
        c = e.seq_create()
        for reqs, msg in [([{"seq": a, "tokens": [1], "mtp": 2}, {"seq": b, "tokens": list(range(14))}], "max_batch"),
                          ([{"seq": c, "tokens": [1], "mtp": 1}], "non-empty"),
                          ([{"seq": a, "tokens": [1], "mtp": 3}], "max_mtp"),
                          ([{"seq": a, "tokens": [1]}, {"seq": a, "tokens": [2]}], "twice")]:
            with pytest.raises(dsv4.DSV4Error, match=msg):
                e.step(reqs)
            assert np.array_equal(e.export(a), snap[0]) and np.array_equal(e.export(b), snap[1])
        with pytest.raises(dsv4.DSV4Error, match="not in"):
            e.seq_truncate(a, 21)
        with pytest.raises(dsv4.DSV4Error, match="both sequence"):
            e.seq_copy(a, a)
        assert np.array_equal(e.export(a), snap[0])
