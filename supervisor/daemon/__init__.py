"""The daemon (``loopd serve``): one asyncio loop, its hosted sessions and their workers.

Nothing is imported here, so that reaching one module of the daemon (the listener's
socket rules, the spawn of a worker) does not load the whole loop.
"""
