"""The architectures ``ggufmtp synth`` can write, one module each (``qwen35``, ``glm4moe``...);
:mod:`.registry` finds them (``arch_for``, ``arch_names``).

Every module of this package defines ``ARCHES``: the :class:`~.base.SynthArch` instances it
provides. They are found by listing the package, so adding an architecture is adding a module.
"""
