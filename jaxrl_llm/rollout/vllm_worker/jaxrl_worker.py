"""The worker extension a jaxrl_llm vLLM server of a mixture-of-experts model loads
(`--worker-extension-cls jaxrl_worker.JaxrlWorkerExtension`, this folder on PYTHONPATH): routed
experts capture (jaxrl_routing_capture.py) and the weight reload that repacks vLLM's CPU experts
(jaxrl_moe_reload.py), all callable with /collective_rpc."""
from jaxrl_moe_reload import MoEReloadExtension
from jaxrl_routing_capture import RoutingCaptureExtension


class JaxrlWorkerExtension(RoutingCaptureExtension, MoEReloadExtension):
    """Both extensions' methods on vLLM's worker class."""
