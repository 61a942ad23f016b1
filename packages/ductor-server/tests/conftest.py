pytest_plugins = ["ductor_server.pytest_plugin"]
