"""tf.errors, as far as the adapter uses it: OpError(node_def, op, message, error_code) and
ResourceExhaustedError(node_def, op, message, *args), raised with TensorFlow's message
"OOM when allocating tensor with shape[...] and type ... on .../device:GPU:N by allocator GPU_N_bfc"."""

RESOURCE_EXHAUSTED = 8


class OpError(Exception):
    def __init__(self, node_def, op, message, error_code, *args):
        super().__init__(message)
        self._node_def, self._op, self._message, self._error_code = node_def, op, message, error_code

    @property
    def message(self):
        return self._message

    @property
    def error_code(self):
        return self._error_code


class ResourceExhaustedError(OpError):
    def __init__(self, node_def, op, message, *args):
        super().__init__(node_def, op, message, RESOURCE_EXHAUSTED, *args)
