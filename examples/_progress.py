"""Progress of an example's long loop: the step, the numbers it tracks (loss, PSNR, ...), the rate and the time
left, shown at least every few seconds.

On a terminal with tqdm installed it is a tqdm bar; otherwise plain lines (a log file reads them as they are,
no ``\\r``): at the first step, then whenever ``every`` seconds have passed, and at the last step. The time
left is the remaining steps at the rate since the first line (which includes start-up and compiling), so the
first line shows none.
``total=None`` (a loop that runs for a time, not a number of steps) shows no step count to reach and no ETA.

    progress = Progress(steps, "training")
    for step in range(1, steps + 1):
        ...
        progress.update(step, loss=loss, PSNR=f"{psnr:.2f} dB")
        progress.write("a line of its own")      # print, without breaking a bar
    progress.close()

``Heartbeat(label)`` prints a line every few seconds while a call that reports nothing (a compile) runs.
"""
import sys
import time


def clock(seconds: float) -> str:
    """``"42s"``, ``"3m05s"``, ``"1h02m"``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _field(name, value) -> str:
    return f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"


def _tqdm_bar(total, label, stream):
    """A tqdm bar on ``stream`` when it is a terminal and tqdm is installed, else ``None``."""
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=label, file=stream, unit="step", dynamic_ncols=True)


class Progress:
    """Reports ``done`` of ``total`` steps of ``label`` (see the module's docstring)."""

    def __init__(self, total, label: str, every: float = 3.0, stream=None):
        self.total, self.label, self.every = total, label, every
        self.stream = sys.stdout if stream is None else stream
        self.start = time.perf_counter()
        self.shown_at, self.done, self.first = None, 0, None
        self.bar = _tqdm_bar(total, label, self.stream)

    def update(self, done: int, **numbers):
        """``done`` steps are done; ``numbers`` (floats or preformatted strings) go on the line."""
        fields = " ".join(_field(k, v) for k, v in numbers.items())
        if self.bar is not None:
            self.bar.set_postfix_str(fields, refresh=False)
            self.bar.update(done - self.done)
            if self.total is not None and done >= self.total:
                self.close()
        else:
            now = time.perf_counter()
            last = self.total is not None and done >= self.total
            if self.shown_at is None or now - self.shown_at >= self.every or last:
                elapsed = now - self.start
                of = "" if self.total is None else f"/{self.total}"
                if self.first is None:
                    self.first = (now, done)
                eta = ""
                if self.total is not None and (done > self.first[1] or last):
                    rate_s = (now - self.first[0]) / max(done - self.first[1], 1)
                    eta = f" ETA {clock(rate_s * (self.total - done))}"
                print(f"{self.label}: step {done}{of} {fields} {done / max(elapsed, 1e-9):.2f} steps/s "
                      f"elapsed {clock(elapsed)}{eta}", file=self.stream, flush=True)
                self.shown_at = now
        self.done = done

    def write(self, text: str):
        """Print ``text`` on a line of its own."""
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self):
        """End a bar (done by itself at the last step); plain lines need nothing."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Heartbeat:
    """A line every ``every`` seconds while a silent call runs (a compile), from a thread of its own::

        with Heartbeat("compiling"):
            first_step()
    """

    def __init__(self, label: str, every: float = 3.0, stream=None):
        self.label, self.every = label, every
        self.stream = sys.stdout if stream is None else stream

    def __enter__(self):
        import threading
        self.stop, start = threading.Event(), time.perf_counter()

        def beat():
            while not self.stop.wait(self.every):
                print(f"{self.label}: {clock(time.perf_counter() - start)}", file=self.stream, flush=True)
        self.thread = threading.Thread(target=beat, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
