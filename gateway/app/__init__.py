"""Process entry points: ``serve``, ``worker``, ``dev``, ``listen mattermost``; the only
package that wires every part together."""
