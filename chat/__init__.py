"""The outbound chat layer: the message contract, a run's renderable state, shared rendering, and each platform's
renderer and messenger. Both the bot and the worker speak to chat platforms through it."""
