from .launch import entrypoint

entrypoint()
