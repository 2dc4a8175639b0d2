"""jax.errors, as far as the adapter uses it: JaxRuntimeError (jaxlib's XlaRuntimeError), which
XLA raises with a status text such as "RESOURCE_EXHAUSTED: Out of memory while trying to
allocate N bytes."."""


class JaxRuntimeError(RuntimeError):
    pass


JaxRuntimeError.__module__ = "jaxlib.xla_extension"
JaxRuntimeError.__qualname__ = "XlaRuntimeError"
XlaRuntimeError = JaxRuntimeError
