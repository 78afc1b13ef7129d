"""Static memory planning: a Graph becomes a Plan (buffers, lifetimes, arena offsets, exact peak)."""

from deepdsl.memory.plan import ALIGN, Buffer, Plan, format_plan, plan

__all__ = ["ALIGN", "Buffer", "Plan", "format_plan", "plan"]
