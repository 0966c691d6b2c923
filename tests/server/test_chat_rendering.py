"""How a chat message reaches the chat template: its text, or OpenAI's list of parts
(--chat-template-content-format openai, or auto for a template that loops over content)."""

from __future__ import annotations

from accord.server.protocol import ChatMessage
from accord.server.serving import _LOOPS_OVER_CONTENT, message_for_template


def test_message_content_reaches_templates_as_text_or_openai_parts() -> None:
    parts = ChatMessage(role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert message_for_template(parts)["content"] == "ab"
    assert message_for_template(parts, as_parts=True)["content"] == [{"type": "text", "text": "a"},
                                                                     {"type": "text", "text": "b"}]
    assert message_for_template(ChatMessage(role="user", content="x"), as_parts=True)["content"] == [
        {"type": "text", "text": "x"}]
    # vLLM's "auto" format: parts for a template that loops over a message's content.
    assert _LOOPS_OVER_CONTENT.search("{% for part in message['content'] %}{{ part.text }}{% endfor %}")
    assert not _LOOPS_OVER_CONTENT.search("{% for message in messages %}{{ message['content'] }}{% endfor %}")
