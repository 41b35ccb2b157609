"""What the alternating benchmarks share: each call warmed up (compiled), then timed in rounds, the calls taking
turns within every round; the medians in ms."""
import statistics
import time


def alternating_medians(calls: dict, rounds: int) -> dict:
    """``{name: median ms}`` of ``calls`` (``{name: f}``), two warm-up calls each, then ``rounds`` rounds in turn."""
    for f in calls.values():
        f(), f()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, f in calls.items():
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}
