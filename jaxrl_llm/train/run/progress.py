"""Training progress: a tqdm bar on a terminal, plain lines every N steps elsewhere.

    progress = Progress(total=cfg.total_steps, initial=start_step, keys=("reward/mean", "loss"))
    for step in range(start_step + 1, cfg.total_steps + 1):
        ...
        progress.update(step, metrics)
    progress.close()

On a terminal the bar shows step, rate, ETA and the latest values of `keys`.
When the stream is not a TTY, or $CI is set, or TERM=dumb, a bar would fill
logs with carriage returns, so one line is printed every `print_every` steps
(and at the last step):

    train step 20/100 (20%) | 1.25 s/step | elapsed 0:00:25 | ETA 0:01:40 | reward/mean=0.41 loss=0.0123
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence, TextIO


def is_interactive(stream: TextIO) -> bool:
    """True for a terminal outside CI, where a redrawn bar is readable."""
    if os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if hasattr(value, "item") and getattr(value, "size", 0) == 1:
        return _format_value(value.item())
    return str(value)


def _format_seconds(seconds: float) -> str:
    return str(_dt.timedelta(seconds=round(seconds)))


class Progress:
    """Step progress with ETA and key metrics.

    Args:
      total: the last step number.
      initial: the step the run starts from (a resumed run's restored step);
        rate and ETA only count steps done in this process.
      keys: metrics shown; None shows the first `max_keys` metrics given.
      print_every: line interval when not interactive.
      enabled: force the bar on or off; None decides from the stream.
      stream: where output goes (default stderr).
      clock: seconds source, injectable for tests.
    """

    def __init__(
        self,
        total: int,
        *,
        initial: int = 0,
        keys: Sequence[str] | None = None,
        max_keys: int = 4,
        print_every: int = 10,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        desc: str = "train",
        clock: Callable[[], float] = time.monotonic,
    ):
        if total < initial:
            raise ValueError(f"total = {total} is below initial = {initial}; valid: total >= initial")
        if print_every < 1:
            raise ValueError(f"print_every = {print_every} is invalid; valid: >= 1")
        self.total, self.initial, self.step = total, initial, initial
        self.keys, self.max_keys, self.print_every, self.desc = keys, max_keys, print_every, desc
        self.stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._start = clock()
        self.bar = None
        if enabled if enabled is not None else is_interactive(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, file=self.stream, dynamic_ncols=True, unit="step")

    def postfix(self, metrics: Mapping[str, Any] | None) -> dict[str, str]:
        if not metrics:
            return {}
        names = [k for k in self.keys if k in metrics] if self.keys is not None else list(metrics)[: self.max_keys]
        return {k: _format_value(metrics[k]) for k in names}

    def eta_seconds(self) -> float | None:
        """Remaining time at the mean rate of this process's steps; None before the first step."""
        done = self.step - self.initial
        if done <= 0:
            return None
        return (self.total - self.step) * (self._clock() - self._start) / done

    def line(self, metrics: Mapping[str, Any] | None = None) -> str:
        elapsed = self._clock() - self._start
        done = self.step - self.initial
        pct = 100.0 * self.step / self.total if self.total else 100.0
        parts = [f"{self.desc} step {self.step}/{self.total} ({pct:.0f}%)"]
        if done > 0:
            parts.append(f"{elapsed / done:.3g} s/step")
        parts.append(f"elapsed {_format_seconds(elapsed)}")
        eta = self.eta_seconds()
        parts.append(f"ETA {_format_seconds(eta) if eta is not None else '?'}")
        shown = self.postfix(metrics)
        if shown:
            parts.append(" ".join(f"{k}={v}" for k, v in shown.items()))
        return " | ".join(parts)

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Moves to `step` (absolute) and shows the latest metrics."""
        advanced = step - self.step
        self.step = step
        if self.bar is not None:
            self.bar.set_postfix(self.postfix(metrics), refresh=False)
            self.bar.update(advanced)
        elif step % self.print_every == 0 or step == self.total:
            print(self.line(metrics), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
