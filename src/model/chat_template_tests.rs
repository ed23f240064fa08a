//! Tests of [`super`]: chat-template rendering, Python methods, `tojson` and `strftime`.

use super::*;
use serde_json::Value as Json;

/// Qwen2.5-Instruct's chat template, verbatim from its `tokenizer_config.json`.
pub(crate) const QWEN25_TEMPLATE: &str = r###"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}"###;

#[test]
fn qwen25_template_renders_exactly() {
    // Expected strings produced by Python jinja2 3.1 with trim_blocks/lstrip_blocks, as transformers.
    let user = [ChatMessage::new("user", "What is 2+3?")];
    let text = render_chat(QWEN25_TEMPLATE, &user, true, None, Some("<|im_end|>")).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
         assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    );
    let convo = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello!"),
        ChatMessage::new("tool", "42"),
    ];
    let text = render_chat(QWEN25_TEMPLATE, &convo, false, None, None).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n\
         </tool_response><|im_end|>\n"
    );
}

#[test]
fn template_tokens_and_raise_exception() {
    let t = "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}\
             {{ raise_exception('role ' + m.role + ' is not supported') }}{% endif %}\
             {{ m.content }}{{ eos_token }}{% endfor %}";
    let msgs = [ChatMessage::new("user", "x")];
    assert_eq!(
        render_chat(t, &msgs, false, Some("<s>"), Some("</s>")).unwrap(),
        "<s>x</s>"
    );
    assert_eq!(render_chat(t, &msgs, false, None, None).unwrap(), "x");
    let err = render_chat(t, &[ChatMessage::new("tool", "y")], false, None, None)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("chat template: "), "{err}");
    assert!(err.contains("role tool is not supported"), "{err}");
    let err = render_chat("{% if %}", &msgs, false, None, None)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("chat template: "), "{err}");
}

#[test]
fn python_methods_and_tojson() {
    let t = "{% for m in messages %}[{{ m.content.split('</think>')[-1].lstrip('\\n').strip() }}|\
             {{ m.role.startswith(('us', 'sy')) }}|{{ m.content.endswith('!') }}|\
             {{ m.content.replace('!', '?').upper() }}|{{ m.get('role', 'none') }}|{{ m.get('x', 'none') }}]\
             {% endfor %}{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}";
    let msgs = [ChatMessage::new("user", "<think>hm</think>\n  hi there !")];
    assert_eq!(
        render_chat(t, &msgs, false, None, None).unwrap(),
        "[hi there !|True|True|<THINK>HM</THINK>\n  HI THERE ?|user|none]a=1;b=2;"
    );
    // Expected from Python: json.dumps(x, ensure_ascii=False) and with indent=2.
    let t = "{% set x = {'a': [1, 2.5, 'é\\n'], 'b': {'c': none, 'd': true}, 'e': []} %}\
             {{ x | tojson }}|{{ x | tojson(indent=2) }}";
    assert_eq!(
        render_chat(t, &[], false, None, None).unwrap(),
        "{\"a\": [1, 2.5, \"é\\n\"], \"b\": {\"c\": null, \"d\": true}, \"e\": []}|\
         {\n  \"a\": [\n    1,\n    2.5,\n    \"é\\n\"\n  ],\n  \"b\": {\n    \"c\": null,\n    \
         \"d\": true\n  },\n  \"e\": []\n}"
    );
}

#[test]
fn strftime_matches_python() {
    // time.strftime("%d %b %Y %A %j %I%p %H:%M:%S %y %e", time.gmtime(1721995199))
    assert_eq!(
        strftime(1_721_995_199, "%d %b %Y %A %j %I%p %H:%M:%S %y %e"),
        "26 Jul 2024 Friday 208 11AM 11:59:59 24 26"
    );
    assert_eq!(strftime(0, "%Y-%m-%d %a %%"), "1970-01-01 Thu %");
    let msgs = [ChatMessage::new("user", "x")];
    let today = render_chat("{{ strftime_now('%Y') }}", &msgs, false, None, None).unwrap();
    assert_eq!(today.len(), 4);
}

/// Real templates (Qwen2.5-Instruct, Qwen3, Llama-3.3-Instruct) on conversations with system
/// prompts, thinking, tool calls and results, and template options, against what transformers'
/// `apply_chat_template(tokenize=False)` rendered (`tests/fixtures/chat_templates/make_expected.py`
/// wrote `expected.json`): byte for byte.
#[test]
fn real_templates_render_as_transformers() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let spec: Json = serde_json::from_str(&read("conversations.json")).unwrap();
    let expected: Json = serde_json::from_str(&read("expected.json")).unwrap();
    let expected = expected.as_object().unwrap();
    assert_eq!(expected.len(), 3);
    let mut compared = 0;
    for (model, want) in expected {
        let template = read(&format!("{model}.jinja"));
        let token = |name: &str| want["tokens"][name].as_str();
        let tokens = [
            ("bos_token", token("bos_token")),
            ("eos_token", token("eos_token")),
        ];
        for case in spec["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let mut options: TemplateOptions = match case.get("options") {
                Some(o) => serde_json::from_value(o.clone()).unwrap(),
                None => TemplateOptions::default(),
            };
            if case.get("with_tools").is_some() {
                options.set("tools", spec["tools"].clone()).unwrap();
            }
            let render = ChatRender {
                template: &template,
                tokens: &tokens,
                options: &options,
            };
            let messages = case["messages"].as_array().unwrap();
            let got = render.render(messages, case["add_generation_prompt"].as_bool().unwrap());
            match (&want["rendered"][name], got) {
                (Json::String(text), Ok(got)) => assert_eq!(&got, text, "{model} {name}"),
                (Json::Object(e), Err(err)) => {
                    let message = e["error"].as_str().unwrap();
                    assert!(err.to_string().contains(message), "{model} {name}: {err}");
                }
                (want, got) => panic!("{model} {name}: expected {want}, rendered {got:?}"),
            }
            compared += 1;
        }
    }
    assert_eq!(compared, 18);
}

#[test]
fn options_are_checked_and_reach_the_template() {
    let err = serde_json::from_str::<TemplateOptions>(r#"{"messages": []}"#).unwrap_err();
    assert!(
        err.to_string()
            .contains("'messages' is set by roll-tui itself"),
        "{err}"
    );
    let err = serde_json::from_str::<TemplateOptions>(r#"{"tools": "x"}"#).unwrap_err();
    assert!(err.to_string().contains("'tools' must be a list"), "{err}");
    // An option overrides a special token, as transformers' keyword arguments do; `tools` and
    // `documents` are defined (none) when not given.
    let options: TemplateOptions =
        serde_json::from_str(r#"{"eos_token": "<E>", "flag": false}"#).unwrap();
    let render = ChatRender {
        template: "{{ eos_token }}|{{ flag is false }}|{{ tools is none }}|{{ documents is defined }}",
        tokens: &[("eos_token", Some("</s>"))],
        options: &options,
    };
    assert_eq!(
        render.render::<ChatMessage>(&[], false).unwrap(),
        "<E>|True|True|True"
    );
}

#[test]
fn tojson_takes_pythons_separators_and_ensure_ascii() {
    // Python: json.dumps({'a': [1, 'é🙂']}, separators=(',', ':'), ensure_ascii=True) and
    // json.dumps([float('-inf'), float('inf')]).
    let t = "{{ {'a': [1, 'é🙂']} | tojson(separators=(',', ':'), ensure_ascii=true) }}|\
             {{ [-1e400, 1e400] | tojson }}";
    assert_eq!(
        render_chat(t, &[], false, None, None).unwrap(),
        "{\"a\":[1,\"\\u00e9\\ud83d\\ude42\"]}|[-Infinity, Infinity]"
    );
    let err = render_chat("{{ 1 | tojson(separators=',') }}", &[], false, None, None);
    assert!(err.unwrap_err().to_string().contains("separators must be"));
}
