"""Tasks: what a run learns, as registered parts (``task:`` in a config; `registry` says what a task owns).

* ``classify`` (`classify`, the default): a label per text;
* ``masked_tokens`` (`masked_tokens`): masked-token denoising on the training split's texts (pretraining).

A plug-in adds one with [register_task][experiments.app.tasks.register_task] (``@register_task("name")`` on a
subclass of [Task][experiments.app.tasks.Task]); `task_of` constructs the task a config names.

May import: the library, `experiments.data`, `experiments.runfolder` (never the rest of `experiments.app`:
its config lists the registered tasks).
"""
from typing import Any, Dict

from .registry import TASKS, Task, register_task
from . import classify, masked_tokens  # noqa: F401 -- registered in this order

__all__ = ["TASKS", "Task", "register_task", "task_of"]


def task_of(cfg: Dict[str, Any]) -> Task:
    """The task ``cfg['task']`` names, constructed for ``cfg`` (``classify`` for a config without the key:
    configs and bundles written before tasks).

    Args:
        cfg: a resolved config.

    Returns:
        A new instance of the registered task.
    """
    return TASKS.lookup(cfg.get("task", "classify"))(cfg)
