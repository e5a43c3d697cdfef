"""Starting and stopping a real tritonserver."""
