"""The prompt template: a file with the method's instructions only, replaceable from config."""

import pytest

from spader.core.prompt import (
    DEFAULT_TEMPLATE_NAME,
    DEFAULT_TEMPLATE_PATH,
    PROMPT_TEMPLATE,
    PROMPT_VERSION,
    PromptTemplate,
    build_messages,
    checked_template,
    load_template,
)

# docs/method.md, "Prompt and format": what the instructions are made of
ELEMENTS = ["<think>", "</think>", '<tool_call>["', "</tool_call>", "<tool_response>", "</tool_response>",
            '<answer>["', "</answer>", "JSON list", "top 5", "100 words"]  # fmt: skip
# lines that steer how much or how long to search change the prompting baselines' scores
STEERING = ["keep searching", "as many times", "as many as", "until", "only at the end", "only once",
            "all of them", "thorough", "exhaustive", "more searches", "search again", "before answering",
            "as much as"]  # fmt: skip


def test_default_template_carries_the_instructions_and_nothing_that_steers_search_depth():
    text = PROMPT_TEMPLATE
    for element in ELEMENTS:
        assert element in text, element
    lowered = text.lower()
    assert [s for s in STEERING if s in lowered] == []
    assert text.endswith("Question: {question}")


def test_the_prompt_is_a_system_message_by_default_and_one_user_message_as_an_option():
    """The paper's "structured system prompt" (Appendix A): the instructions as a system message,
    the question as the user turn; the authors' code sends the whole prompt as one user message."""
    from spader.config.model import AgentConfig

    system, user = build_messages("Which films?")
    assert (system["role"], user["role"]) == ("system", "user")
    assert user["content"] == "Question: Which films?"
    assert system["content"] == PROMPT_TEMPLATE.removesuffix("Question: {question}").rstrip()
    assert AgentConfig().prompt_role == load_template().role == "system"  # one default
    (whole,) = load_template(role="user").messages("Which films?")
    assert whole == {"role": "user", "content": PROMPT_TEMPLATE.replace("{question}", "Which films?")}
    # a template with nothing before the question's line has no system message
    assert PromptTemplate("Question: {question}").messages("Q") == [
        {"role": "user", "content": "Question: Q"}
    ]
    # what follows the question's line stays in the user turn
    two = PromptTemplate("Do it.\nQ: {question}\nThink first.").messages("x")
    assert two == [{"role": "system", "content": "Do it."}, {"role": "user", "content": "Q: x\nThink first."}]
    with pytest.raises(ValueError, match="prompt role must be one of"):
        load_template(role="tool")
    planned = {"path": None, "version": PROMPT_VERSION, "role": "user"}
    assert checked_template(planned).messages("Which films?") == [whole]  # the rule's param


def test_template_is_the_file_and_its_hash_is_the_version():
    template = load_template()
    # named by its place in the package (relocatable), not by where it is installed
    assert template.source == DEFAULT_TEMPLATE_NAME and DEFAULT_TEMPLATE_PATH.suffix == ".txt"
    assert DEFAULT_TEMPLATE_PATH.as_posix().endswith("/" + DEFAULT_TEMPLATE_NAME)
    assert template.text == DEFAULT_TEMPLATE_PATH.read_text(encoding="utf-8").rstrip("\n")
    assert template.version == PROMPT_VERSION and len(PROMPT_VERSION) == 12


def test_a_replacement_template_from_config(tmp_path):
    path = tmp_path / "authors.txt"
    path.write_text(
        'Search with {"json": "braces kept"} then answer.\nQuestion: {question}\n\n', encoding="utf-8"
    )
    template = load_template(path)
    assert template.user_prompt("Who {question}?") == (
        'Search with {"json": "braces kept"} then answer.\nQuestion: Who {question}?'
    )
    assert template.version != PROMPT_VERSION
    assert build_messages("Q", template) == [
        {"role": "system", "content": 'Search with {"json": "braces kept"} then answer.'},
        {"role": "user", "content": "Question: Q"},
    ]
    path.write_text("Question: {question}, again {question}", encoding="utf-8")
    with pytest.raises(ValueError, match=r"authors.txt: needs exactly one \{question\} placeholder, found 2"):
        load_template(path)
    path.write_bytes(b"\xff\xfe Question: {question}")
    with pytest.raises(ValueError, match="authors.txt: not UTF-8"):
        load_template(path)


def test_a_job_refuses_a_template_edited_after_the_workflow_planned_it(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("Answer this.\nQuestion: {question}", encoding="utf-8")
    planned = load_template(path).version
    assert checked_template({"path": str(path), "version": planned}).version == planned
    assert checked_template(None).version == PROMPT_VERSION  # no param: the project's template
    path.write_text("Answer this carefully.\nQuestion: {question}", encoding="utf-8")
    with pytest.raises(
        ValueError, match=rf"mine.txt has version \w+, but the job was planned with {planned}"
    ):
        checked_template({"path": str(path), "version": planned})
