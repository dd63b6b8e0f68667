

def test_the_note_says_which_test_of_the_waiting_a_rank_misses():
    """Rank 1 causes 6.8× rank 0's waiting but arrives last at 4 of its 10 ops: the note says
    that, not that the waiting is spread or too small; a rank causing 2× says spread; one that
    passes both tests but is unnamed says too small, inside the noise."""
    import pandas as pd

    from pardiag.analyzer.analyses.stragglers import straggler_noise_note

    def st(caused, last):
        return pd.DataFrame({"rank": [1, 0], "wait_caused_us": caused,
                             "last_arrivals": [last, 6], "instances": [10, 10]})
    assert straggler_noise_note(st([49249.0, 7241.0], 4), None) == (
        "no straggler named by the waiting: rank 1 causes 6.8× the next rank's waiting (rank "
        "1 causes 49249 µs, rank 0 7241 µs) but arrives last at only 4 of its 10 ops (a "
        "straggler arrives last at 50% or more): by the waiting alone it is late at some "
        "collectives, not most")
    assert straggler_noise_note(st([2000.0, 1000.0], 8), None).startswith(
        "no straggler named by the waiting: the waiting is spread over the ranks (rank 1 "
        "causes 2000 µs, rank 0 1000 µs: a straggler causes 3× the next rank's)")
    assert straggler_noise_note(st([4000.0, 1000.0], 8), None).endswith(
        "this is inside the noise")
    assert straggler_noise_note(st([4000.0, 1000.0], 8), 1) is None


def test_ranks_that_arrive_last_together_share_the_waiting_and_none_is_named(tmp_path):
    """4 ranks, 3 steps of 4 all-reduces each: ranks 0 and 1 compute 300 µs more than ranks 2
    and 3 (Ulysses' uneven heads) and arrive together; ranks 2 and 3 wait 300 µs at every
    all-reduce for both of them. The waiting (2 × 12 × 300 µs) is the pair's, 3600 µs each,
    not rank 0's by its number, and no straggler is named, also when rank 1 arrives 25 µs after
    rank 0 (a tenth of the skew: late together); with rank 1 alone late, it is."""
    from pardiag.analyzer.analyses.stragglers import late_together
    from pardiag.analyzer.analyses.sync import compute_sync
    from pardiag.analyzer.trace import load_traces

    from .synth import TraceBuilder
    from .test_cross_rank import EPOCH, _coll

    for late, after in (((0, 1), 0), ((0, 1), 25), ((1,), 0)):
        d = tmp_path / f"{'-'.join(map(str, late))}+{after}"
        d.mkdir()
        for r in range(4):
            b = TraceBuilder(rank=r, world_size=4)
            seq = 0
            for step in range(3):
                t = EPOCH + step * 10_000
                b.step(step + 1, t, 10_000)
                for k in range(4):
                    seq += 1
                    arrive = (t + 1000 + 2000 * k + (300 if r in late else 0)
                              + (after if r == 1 else 0))
                    b.kernel("gemm_kernel", arrive - 800, 800, launch_ts=arrive - 790)
                    end = t + 1000 + 2000 * k + 300 + after + 100
                    _coll(b, "AllReduce", (0, 1, 2, 3), "0", arrive, end - arrive,
                          arrive - 5, seq=seq)
            b.write(d / f"rank{r}.json")
        sync = compute_sync(load_traces(d, cache=False))
        st = sync.stragglers.set_index("rank")
        if late == (0, 1):   # rank 1 25 µs after rank 0 is late with it, not alone
            assert st.loc[0, "wait_caused_us"] == st.loc[1, "wait_caused_us"]
            assert st.loc[[0, 1], "last_arrivals"].tolist() == [12, 12]
            assert sync.straggler is None
            assert late_together(sync.stragglers) == [0, 1]
            assert any(n.startswith("no straggler named by the waiting: ranks 0, 1 arrive last "
                                    "together") for n in sync.notes)
        else:
            assert st.loc[1, "wait_caused_us"] == 3 * 12 * 300.0 and sync.straggler == 1
