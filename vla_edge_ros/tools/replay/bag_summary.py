"""What the bag holds, for the report: every topic with its type, count and rate, and which ones replay used.

A user handed a report should be able to tell, without opening the bag, whether the right camera,
command and state topics were matched and whether they ran at the rate they should: a camera recorded at 12 Hz
instead of 30 explains drops and gaps that no policy causes. Rates come from each topic's own first
and last receive times (one pass over the bag's index and records, no message decoded).
"""

from __future__ import annotations

from typing import Any

from ...bags.reader import Bag


def topic_summary(bag: Bag, image_topic: str, command_topic: str | None,
                  state_topic: str | None = None) -> list[dict[str, Any]]:
    """One entry per topic: name, type, messages, first_s / last_s (bag time from its start), rate_hz
    (None below two messages or over no time), role ("camera", "recorded command", "robot state" or None)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for topic, time_ns in bag.times(list(bag.topics)):
        first.setdefault(topic, time_ns)
        last[topic] = time_ns
    roles = {image_topic: "camera", command_topic: "recorded command", state_topic: "robot state"}
    summary = []
    for name, info in bag.topics.items():
        span_s = (last[name] - first[name]) / 1e9 if name in first else 0.0
        summary.append({
            "name": name, "type": info.msgtype, "messages": info.count,
            "first_s": (first[name] - bag.start_ns) / 1e9 if name in first else None,
            "last_s": (last[name] - bag.start_ns) / 1e9 if name in last else None,
            "rate_hz": (info.count - 1) / span_s if span_s > 0 else None,
            "role": roles.get(name)})
    return summary
