"""The Meta-World tasks by name, each with the sentence an instruction-following policy is given.

The sentences are ours: short, plain English, one per task, saying what success looks like (the puck at
the goal, the drawer shut) rather than how the arm gets there, so that a policy must read the camera to
know where. Names are Meta-World's own (``push-v3``); the wheel's models, layouts and experts are keyed by
them. Nothing here imports MuJoCo: a harness can list tasks and validate a configuration on a machine
without the extra.
"""

from __future__ import annotations

DESCRIPTIONS: dict[str, str] = {
    "assembly-v3": "put the ring on the peg",
    "basketball-v3": "dunk the ball into the basket",
    "bin-picking-v3": "move the puck from one bin to the other",
    "box-close-v3": "put the lid on the box",
    "button-press-topdown-v3": "press the button down from above",
    "button-press-topdown-wall-v3": "press the button down from above, past the wall",
    "button-press-v3": "push the button in from the front",
    "button-press-wall-v3": "push the button in, past the wall",
    "coffee-button-v3": "press the button on the coffee machine",
    "coffee-pull-v3": "pull the mug away from the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "turn the dial",
    "disassemble-v3": "lift the ring off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "lock the door",
    "door-open-v3": "open the door",
    "door-unlock-v3": "unlock the door",
    "hand-insert-v3": "put the block into the hole",
    "drawer-close-v3": "close the drawer",
    "drawer-open-v3": "open the drawer",
    "faucet-open-v3": "turn the faucet on",
    "faucet-close-v3": "turn the faucet off",
    "hammer-v3": "hammer the nail into the wall",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "pick-place-wall-v3": "pick up the puck and place it at the goal, past the wall",
    "pick-out-of-hole-v3": "lift the puck out of the hole",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the goal",
    "plate-slide-side-v3": "slide the plate sideways into the goal",
    "plate-slide-back-v3": "slide the plate back out of the goal",
    "plate-slide-back-side-v3": "slide the plate sideways back out of the goal",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "peg-unplug-side-v3": "pull the peg out of the hole sideways",
    "soccer-v3": "kick the ball into the goal",
    "stick-push-v3": "use the stick to push the thermos to the goal",
    "stick-pull-v3": "use the stick to pull the thermos to the goal",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck past the wall to the goal",
    "push-back-v3": "pull the puck back to the goal",
    "reach-v3": "move the gripper to the goal",
    "reach-wall-v3": "move the gripper past the wall to the goal",
    "shelf-place-v3": "put the block on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}
TASKS = tuple(DESCRIPTIONS)  # every Meta-World v3 task the wheel ships (50)

# MT10, the ten-task benchmark LeRobot and the Meta-World paper report: what the multi-task policy learns
MT10 = ("reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3")


def description(task: str) -> str:
    """The instruction for ``task``; a ValueError naming the known tasks for an unknown one."""
    if task not in DESCRIPTIONS:
        raise ValueError(f"unknown Meta-World task {task!r}: expected one of {', '.join(TASKS)}")
    return DESCRIPTIONS[task]
