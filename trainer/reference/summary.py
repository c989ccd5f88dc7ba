"""What a ``genaug train`` run did: :class:`TrainSummary`, and the report it prints."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["TrainSummary"]


@dataclass
class TrainSummary:
    """What a run did; :meth:`format` is what ``genaug train`` prints."""

    steps: int = 0
    epochs: int = 0
    global_batch: int = 0
    replicas: int = 0
    devices: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    images: int = 0
    final_loss: float | None = None
    final_accuracy: float | None = None
    mixing: bool = False
    p: float = 0.0
    mixed_fraction: float = 0.0
    examples_seen: int = 0
    replaced_per_class: list[int] = field(default_factory=list)
    tracing_counts: dict[str, int] = field(default_factory=dict)
    input_wait_share: float | None = None
    median_step_ms: float | None = None
    median_wait_ms: float | None = None
    audit: str = "not run"
    feeder: dict[str, Any] | None = None
    label_map: dict[str, int] = field(default_factory=dict)
    source: str = ""
    fit_s: float = 0.0

    @property
    def step_tracing_count(self) -> int:
        """Traces of the function that ran the steps (the most traced one): 1 is healthy."""
        return max(self.tracing_counts.values(), default=0)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy."""
        return asdict(self)

    def format(self) -> str:
        """A short multi-line report."""
        lines = ["genaug train summary"]
        per_epoch = self.steps // self.epochs if self.epochs else self.steps
        lines.append(
            f"  steps            {self.steps} ({self.epochs} epoch(s) x {per_epoch}), global batch "
            f"{self.global_batch} on {self.replicas} replica(s) [{', '.join(self.devices)}]"
        )
        lines.append(
            f"  data             {self.images} images, classes {self.classes} ({self.source})"
        )
        if self.final_loss is not None:
            acc = f", accuracy {self.final_accuracy:.3f}" if self.final_accuracy is not None else ""
            lines.append(f"  last epoch       loss {self.final_loss:.4f}{acc}")
        if self.mixing:
            lines.append(
                f"  synthetic mixed  {self.mixed_fraction:.3f} of {self.examples_seen} examples "
                f"(p={self.p}; below p while the reservoir was filling)"
            )
            if self.replaced_per_class:
                per_class = ", ".join(
                    f"{name}: {n}" for name, n in zip(self.classes, self.replaced_per_class,
                                                      strict=False)
                )
                lines.append(f"  replacements     by class {per_class}")
        else:
            lines.append("  synthetic mixed  off (no --service/--recipe, or --p 0)")
        counts = ", ".join(f"{k}: {v}" for k, v in self.tracing_counts.items()) or "n/a"
        lines.append(f"  step tracing     {self.step_tracing_count} ({counts})")
        if self.input_wait_share is not None:
            lines.append(
                f"  input wait       {100 * self.input_wait_share:.1f}% of step time (median step "
                f"{self.median_step_ms:.1f} ms, median wait {self.median_wait_ms:.2f} ms; "
                "first step excluded)"
            )
        lines.append(f"  graph audit      {self.audit}")
        if self.feeder is not None:
            f = self.feeder
            lines.append(
                f"  feeder           {f['images_received']} images in {f['requests']} requests, "
                f"{f['errors']} errors{'; last: ' + f['last_error'] if f['last_error'] else ''}"
            )
        lines.append(f"  fit time         {self.fit_s:.1f} s")
        return "\n".join(lines)
