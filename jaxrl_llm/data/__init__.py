"""jaxrl_llm.data: prompt sources, tasks, chat templates, data set files. Plain Python, no JAX.

Imports nothing of jaxrl_llm except jaxrl_llm.rewards (each task names its grader).
"""
from jaxrl_llm.data.chat_template import ChatTemplate, ChatTemplateError, render_chat_template
from jaxrl_llm.data.environments import (
    EnvironmentOutputError,
    EnvTask,
    SingleTurnEnv,
    StepResult,
)
from jaxrl_llm.data.files import (
    BOXED_INSTRUCTION,
    EXAMPLES_DIR,
    DataFileTask,
    DatasetFormatError,
    JsonlTask,
    load_jsonl,
    read_rows,
)
from jaxrl_llm.data.records import HELDOUT, SPLITS, TRAIN, Example, split_of, unit_hash
from jaxrl_llm.data.tasks import (
    DEFAULT_HELDOUT_FRACTION,
    REASONING_GYM_TASKS,
    AdditionTask,
    GeneratedTask,
    ReasoningGymTask,
    Task,
)
from jaxrl_llm.data.code_tasks import CODE_INSTRUCTION, FunctionFromExamplesTask, HumanEvalTask
from jaxrl_llm.data.registry import (
    TASK_FACTORIES,
    accepted_arguments,
    check_task_kwargs,
    import_task_plugins,
    make_task,
    register_task,
    task_names,
)

__all__ = [
    "CODE_INSTRUCTION",
    "FunctionFromExamplesTask",
    "HumanEvalTask",
    "BOXED_INSTRUCTION",
    "DEFAULT_HELDOUT_FRACTION",
    "EXAMPLES_DIR",
    "HELDOUT",
    "REASONING_GYM_TASKS",
    "SPLITS",
    "TASK_FACTORIES",
    "TRAIN",
    "AdditionTask",
    "ChatTemplate",
    "ChatTemplateError",
    "DataFileTask",
    "DatasetFormatError",
    "EnvTask",
    "EnvironmentOutputError",
    "SingleTurnEnv",
    "StepResult",
    "Example",
    "GeneratedTask",
    "JsonlTask",
    "ReasoningGymTask",
    "Task",
    "accepted_arguments",
    "check_task_kwargs",
    "import_task_plugins",
    "load_jsonl",
    "make_task",
    "read_rows",
    "register_task",
    "render_chat_template",
    "split_of",
    "task_names",
    "unit_hash",
]
