

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
