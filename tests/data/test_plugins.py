"""load_object: 'module:attribute' names from a config become objects, bad names get clear errors."""
import math
import os.path

import pytest

from jaxrl_llm.data.plugins import PluginError, load_object


def test_loads_function_and_dotted_attribute():
    assert load_object("math:sqrt") is math.sqrt
    assert load_object("os.path:join") is os.path.join
    assert load_object("collections:OrderedDict.fromkeys") == __import__("collections").OrderedDict.fromkeys


@pytest.mark.parametrize("spec, message", [
    ("math.sqrt", "expected 'package.module:attribute'"),
    ("math:sqrt; import os", "expected 'package.module:attribute'"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("math:no_such_function", "has no attribute 'no_such_function'"),
])
def test_bad_names_say_what_is_wrong(spec, message):
    with pytest.raises(PluginError, match="task.reward_fn") as err:
        load_object(spec, what="task.reward_fn")
    assert message in str(err.value)
