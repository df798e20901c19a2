"""Differential audit of chat templates and of the chat request -> prompt path.

Real-world templates (Llama 3.1/3.2 with tools, ipython and the date; Qwen2.5 and Qwen3 with tool calls, tool
responses, enable_thinking and earlier turns' reasoning; Mistral v3 (tools, [INST], system) and v7 (content
blocks); Phi-3 / Phi-4; Gemma 2 / 3 (no system role); DeepSeek-R1; a documents template; SmolLM2's own, from the
embedded GGUF) are written into tiny tokenizer directories (the synthetic byte-level BPE plus each family's special
tokens; Llama's and Mistral's prepend BOS). Oracles: transformers' apply_chat_template renders; vLLM's OpenAI chat
semantics (`vllm_conversation` restates them: text parts joined with "\\n" for templates that take a string, the
parts themselves for templates that loop over them, a tool's parts joined, None content as "" / no parts, empty
tool_calls dropped, arguments text parsed to a value ({} when it is not JSON)) turn a request into the messages the
template gets. The token ids the engine gets (LLM.chat, /v1/chat/completions) must be transformers'
apply_chat_template(tokenize=True) ids: the template writes BOS, nothing adds a second; special tokens written in a
message are special tokens (transformers' default and vLLM: no escaping).
"""
from __future__ import annotations

import json
import os
import re
import warnings

import pytest
from tokenizers import AddedToken, processors

from decodekit import SamplingParams
from decodekit.server import protocol as P
from decodekit.server.tools import parse_tools
from decodekit.tokenizer import Tokenizer, builders
from decodekit.tokenizer.chat import template_content_format

transformers = pytest.importorskip("transformers")
jinja2 = pytest.importorskip("jinja2")

LLAMA31 = r"""{{- bos_token }}{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}
{%- if strftime_now is defined %}{%- set date_string = strftime_now("%d %b %Y") %}
{%- else %}{%- set date_string = "26 Jul 2024" %}{%- endif %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}{%- if messages[0]['role'] == 'system' %}
{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}{%- else %}
{%- set system_message = "" %}{%- endif %}{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}{{- "Environment: ipython\n" }}{%- endif %}
{%- if builtin_tools is defined %}
{{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
{{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
{{- "Do not use variables.\n\n" }}{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\n\n" }}{%- endfor %}
{%- endif %}{{- system_message }}{{- "<|eot_id|>" }}{%- if tools_in_user_message and not tools is none %}
{%- if messages | length != 0 %}{%- set first_user_message = messages[0]['content']|trim %}
{%- set messages = messages[1:] %}{%- else %}
{{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}{{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
{{- "Given the following functions, please respond with a JSON for a function call " }}
{{- "with its proper arguments that best answers the given prompt.\n\n" }}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
{{- "Do not use variables.\n\n" }}{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\n\n" }}{%- endfor %}
{{- first_user_message + "<|eot_id|>"}}{%- endif %}{%- for message in messages %}
{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- elif 'tool_calls' in message %}{%- if not message.tool_calls|length == 1 %}
{{- raise_exception("This model only supports single tool-calls at once!") }}{%- endif %}
{%- set tool_call = message.tool_calls[0].function %}
{%- if builtin_tools is defined and tool_call.name in builtin_tools %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{{- "<|python_tag|>" + tool_call.name + ".call(" }}
{%- for arg_name, arg_val in tool_call.arguments | items %}{{- arg_name + '="' + arg_val + '"' }}
{%- if not loop.last %}{{- ", " }}{%- endif %}{%- endfor %}{{- ")" }}{%- else  %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{{- '{"name": "' + tool_call.name + '", ' }}
{{- '"parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}{%- endif %}
{%- if builtin_tools is defined %}{{- "<|eom_id|>" }}{%- else %}{{- "<|eot_id|>" }}{%- endif %}
{%- elif message.role == "tool" or message.role == "ipython" %}
{{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
{%- if message.content is mapping or message.content is iterable %}{{- message.content | tojson }}{%- else %}
{{- message.content }}{%- endif %}{{- "<|eot_id|>" }}{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"""

QWEN25 = r"""{%- if tools %}{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}
{{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}{%- if messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{%- else %}
{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
{%- endif %}{%- endif %}{%- for message in messages %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{%- elif message.role == "assistant" %}{{- '<|im_start|>' + message.role }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' }}{{- message.content }}{{- '\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"""

QWEN3 = r"""{%- if tools %}{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}
{%- endif %}{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}
{%- for message in messages %}
{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
{%- elif message.role == "assistant" %}{%- set reasoning_content = '' %}
{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}{%- else %}
{%- if '</think>' in content %}
{%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}{%- endif %}
{%- if loop.index0 > ns.last_query_index %}{%- if loop.last or (not loop.last and reasoning_content) %}
{{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}{{- '<|im_start|>' + message.role + '\n' + content }}{%- endif %}{%- else %}
{{- '<|im_start|>' + message.role + '\n' + content }}{%- endif %}{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if (loop.first and content) or (not loop.first) %}{{- '\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}
{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}{{- '}\n</tool_call>' }}{%- endfor %}{%- endif %}
{{- '<|im_end|>\n' }}{%- elif message.role == "tool" %}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' }}{{- content }}{{- '\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}{%- endif %}
{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""

MISTRAL_V3 = r"""{%- if messages[0]["role"] == "system" %}{%- set system_message = messages[0]["content"] %}
{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{%- set ns = namespace() %}{%- set ns.index = 0 %}{%- for message in loop_messages %}
{%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
{%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
{{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
{%- endif %}{%- set ns.index = ns.index + 1 %}{%- endif %}{%- endfor %}{{- bos_token }}
{%- for message in loop_messages %}{%- if message["role"] == "user" %}
{%- if tools is not none and (message == user_messages[-1]) %}{{- "[AVAILABLE_TOOLS] [" }}
{%- for tool in tools %}{%- set tool = tool.function %}{{- '{"type": "function", "function": {' }}
{%- for key, val in tool.items() if key != "return" %}
{%- if val is string %}{{- '"' + key + '": "' + val + '"' }}
{%- else %}{{- '"' + key + '": ' + val|tojson }}{%- endif %}{%- if not loop.last %}{{- ", " }}{%- endif %}
{%- endfor %}{{- "}}" }}{%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" }}{%- endif %}{%- endfor %}
{{- "[/AVAILABLE_TOOLS]" }}{%- endif %}{%- if loop.last and system_message is defined %}
{{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}{%- else %}
{{- "[INST] " + message["content"] + "[/INST]" }}{%- endif %}
{%- elif message.tool_calls is defined and message.tool_calls is not none %}{{- "[TOOL_CALLS] [" }}
{%- for tool_call in message.tool_calls %}{%- set out = tool_call.function|tojson %}{{- out[:-1] }}
{%- if not tool_call.id is defined or tool_call.id|length != 9 %}
{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{%- endif %}
{{- ', "id": "' + tool_call.id + '"}' }}
{%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" + eos_token }}{%- endif %}{%- endfor %}
{%- elif message["role"] == "assistant" %}{{- " " + message["content"]|trim + eos_token}}
{%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
{%- if message.content is defined and message.content.content is defined %}
{%- set content = message.content.content %}{%- else %}{%- set content = message.content %}{%- endif %}
{{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
{%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{%- endif %}
{{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}{%- else %}
{{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
{%- endif %}
{%- endfor %}"""

# Mistral-Small-3.1 (v7 tokenizer): content a string or a list of blocks (vLLM: the "openai" content format)
MISTRAL_V7 = r"""{%- set today = strftime_now("%Y-%m-%d") %}
{%- set default_system_message = "You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI.\nThe current date is " + today + "." %}
{{- bos_token }}{%- if messages[0]['role'] == 'system' %}{%- if messages[0]['content'] is string %}
{%- set system_message = messages[0]['content'] %}{%- else %}
{%- set system_message = messages[0]['content'][0]['text'] %}{%- endif %}{%- set loop_messages = messages[1:] %}
{%- else %}{%- set system_message = default_system_message %}{%- set loop_messages = messages %}{%- endif %}
{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{%- for message in loop_messages %}
{%- if message['role'] == 'user' %}{%- if message['content'] is string %}
{{- '[INST]' + message['content'] + '[/INST]' }}{%- else %}{{- '[INST]' }}{%- for block in message['content'] %}
{%- if block['type'] == 'text' %}{{- block['text'] }}{%- elif block['type'] in ['image', 'image_url'] %}
{{- '[IMG]' }}{%- else %}{{- raise_exception('Only text and image blocks are supported in message content!') }}
{%- endif %}{%- endfor %}{{- '[/INST]' }}{%- endif %}{%- elif message['role'] == 'system' %}
{%- if message['content'] is string %}{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}
{%- else %}{{- '[SYSTEM_PROMPT]' + message['content'][0]['text'] + '[/SYSTEM_PROMPT]' }}{%- endif %}
{%- elif message['role'] == 'assistant' %}{%- if message['content'] is string %}
{{- message['content'] + eos_token }}{%- else %}{{- message['content'][0]['text'] + eos_token }}{%- endif %}
{%- else %}{{- raise_exception('Only user, system and assistant roles are supported!') }}{%- endif %}
{%- endfor %}"""

GEMMA3 = r"""{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- if messages[0]['content'] is string -%}
{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- else -%}
{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}
{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = "" -%}
{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
{%- endif -%}
{%- if (message['role'] == 'assistant') -%}{%- set role = "model" -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
{%- if message['content'] is string -%}
        {{ message['content'] | trim }}
{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}
{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}
{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}
{%- else -%}
        {{ raise_exception("Invalid content type") }}
{%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}"""

PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + "
        "'<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
        "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")

PHI4 = ("{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
        "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
        "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'assistant') %}{{'<|im_start|>assistant"
        "<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}")

GEMMA2 = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
          "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
          "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")

_DS_CALL = ("tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + "
            "tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'")
DEEPSEEK_R1 = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}"
    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}"
    "{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}"
    "{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and 'tool_calls' in message %}{%- set ns.is_tool = false -%}"
    "{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}{%- if message['content'] is none %}"
    "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + " + _DS_CALL + "}}{%- else %}"
    "{{'<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + " + _DS_CALL + "}}"
    "{%- endif %}{%- set ns.is_first = true -%}{%- else %}{{'\\n' + '<｜tool▁call▁begin｜>' + " + _DS_CALL + "}}"
    "{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and 'tool_calls' not in message %}{%- if ns.is_tool %}"
    "{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}"
    "{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}"
    "{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}"
    "{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + "
    "'<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'<｜tool▁output▁begin｜>' + "
    "message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}"
    "{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}")

# SmolLM2-135M-Instruct's (the embedded GGUF's; test_embedded_model_chat_ids_equal_transformers checks it is)
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
           "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>'"
           " + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt"
           " %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# grounded generation (Command-R / Granite style): the request's documents as a template variable
DOCS = ("{{ bos_token }}{% if documents %}<docs>{% for d in documents %}[{{ loop.index0 }}] {{ d.title }}: {{ d.text }}\n"
        "{% endfor %}</docs>{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


_MISTRAL = ["<s>", "</s>", "[INST]", "[/INST]"]
_DEEPSEEK = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
             "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
             "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]
# family: (template, bos, eos, tokenizer prepends BOS, special tokens, plain added tokens)
FAMILIES = {
    "llama3": (LLAMA31, "<|begin_of_text|>", "<|eot_id|>", True, ["<|begin_of_text|>", "<|start_header_id|>",
               "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"], []),
    "qwen25": (QWEN25, None, "<|im_end|>", False, [], ["<tool_call>", "</tool_call>"]),
    "qwen3": (QWEN3, None, "<|im_end|>", False, [], ["<tool_call>", "</tool_call>", "<think>", "</think>"]),
    "mistral3": (MISTRAL_V3, "<s>", "</s>", True, _MISTRAL + ["[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                                                              "[TOOL_RESULTS]", "[/TOOL_RESULTS]"], []),
    "mistral7": (MISTRAL_V7, "<s>", "</s>", True, _MISTRAL + ["[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[IMG]"], []),
    "phi3": (PHI3, "<s>", "<|endoftext|>", False, ["<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], []),
    "phi4": (PHI4, "<|endoftext|>", "<|im_end|>", False, ["<|im_sep|>"], []),
    "gemma2": (GEMMA2, "<bos>", "<eos>", True, ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], []),
    "gemma3": (GEMMA3, "<bos>", "<eos>", True, ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
                                                "<start_of_image>"], []),
    "deepseek_r1": (DEEPSEEK_R1, _DEEPSEEK[0], _DEEPSEEK[1], True, _DEEPSEEK, ["<think>", "</think>"]),
    "smollm2": (SMOLLM2, "<|im_start|>", "<|im_end|>", False, [], []),
    "docs": (DOCS, "<s>", "</s>", True, ["<s>", "</s>"], []),
}
OPENAI_FORMAT = {"mistral7", "gemma3"}      # the templates that loop over a message's content parts


def write_tokenizer_dir(d: str, template: str, bos, eos, add_bos: bool, special, plain) -> str:
    """A tokenizer directory: the synthetic byte-level BPE plus these tokens, BOS prepended when add_bos."""
    b = builders.synthetic_backend(1024)
    b.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    b.add_tokens([AddedToken(s, special=False, normalized=False) for s in plain])
    if add_bos:
        b.post_processor = processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                                         special_tokens=[(bos, b.token_to_id(bos))])
    os.makedirs(d, exist_ok=True)
    b.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
                   "chat_template": template, "add_bos_token": add_bos, "add_eos_token": False}, f)
    return d


def hf_tokenizer(d: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(d)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """family -> (decodekit's Tokenizer, transformers' tokenizer) of the same directory."""
    root = tmp_path_factory.mktemp("chat_audit")
    out = {}
    for fam, spec in FAMILIES.items():
        d = write_tokenizer_dir(str(root / fam), *spec)
        out[fam] = (Tokenizer.from_pretrained_dir(d), hf_tokenizer(d))
    return out


# ------------------------------------------------------------------ the oracles and the path under test
def vllm_conversation(messages: list[dict], fmt: str) -> list[dict]:
    """A request's messages as vLLM hands them to apply_chat_template (content format fmt: "string" / "openai")."""
    out = []
    for m in messages:
        c = m.get("content")
        texts = [] if c is None else [c] if isinstance(c, str) else [p["text"] for p in c]
        r = {"role": m["role"], "content": [{"type": "text", "text": t} for t in texts] if fmt == "openai"
             else "\n".join(texts)}
        if m["role"] == "assistant":
            if m.get("tool_calls") is not None:
                r["tool_calls"] = json.loads(json.dumps(m["tool_calls"]))
            if m.get("reasoning") is not None:
                r["reasoning"] = r["reasoning_content"] = m["reasoning"]
        if m["role"] == "tool":
            if "tool_call_id" in m:
                r["tool_call_id"] = m["tool_call_id"]
            r["content"] = "\n".join(texts)
        if isinstance(m.get("name"), str):
            r["name"] = m["name"]
        if r.get("tool_calls") == []:
            del r["tool_calls"]
        for call in r.get("tool_calls") or ():
            args = call["function"].get("arguments")
            try:
                call["function"]["arguments"] = json.loads(args) if isinstance(args, str) else args
            except ValueError:
                call["function"]["arguments"] = {}
        out.append(r)
    return out


def oracle(hf, body: dict, fmt: str, tokenize: bool = False):
    """transformers' rendering (or ids) of vLLM's messages for the request `body`."""
    kw = {"return_dict": False} if tokenize else {}
    return hf.apply_chat_template(vllm_conversation(body["messages"], fmt), tools=body.get("tools"),
                                  documents=body.get("documents"), chat_template=body.get("chat_template"),
                                  add_generation_prompt=body.get("add_generation_prompt", True),
                                  continue_final_message=body.get("continue_final_message", False),
                                  tokenize=tokenize, **kw, **body.get("chat_template_kwargs", {}))


def ours(tok, body: dict, tokenize: bool = False):
    """decodekit's /v1/chat/completions path (server/app.py render_chat) on a tokenizer."""
    msgs = P.chat_messages(body)
    agp, cont = P.chat_render_options(body, msgs)
    template, kwargs = P.chat_template_fields(body, True)
    docs = P.chat_documents(body)
    tools, _ = parse_tools({"tools": body.get("tools"), "tool_choice": "none"})
    text = tok.apply_chat_template(msgs, add_generation_prompt=agp, continue_final_message=cont, chat_template=template,
                                   **({"tools": tools} if tools else {}),
                                   **({"documents": docs} if docs is not None else {}), **kwargs)
    return tok.encode(text, add_special_tokens=False) if tokenize else text


def _u(text):
    return {"role": "user", "content": text}


def _parts(*texts):
    return [{"type": "text", "text": t} for t in texts]


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def _calling(args, content=None, **extra):
    return [_u("Weather in Paris?"), {"role": "assistant", "content": content, **extra,
                                      "tool_calls": [{**CALL, "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "22C"}]


CASES = {
    "system_multi_turn": {"messages": [{"role": "system", "content": "Be terse."}, _u("Hi"),
                                       {"role": "assistant", "content": "Hello!"}, _u("2+2?")]},
    "no_generation_prompt": {"messages": [_u("x"), {"role": "assistant", "content": "y"}],
                             "add_generation_prompt": False},
    "continue_final": {"messages": [_u("Name a color"), {"role": "assistant", "content": "The color is"}],
                       "add_generation_prompt": False, "continue_final_message": True},
    "continue_trailing_space": {"messages": [_u("Go"), {"role": "assistant", "content": '{"name": "'}],
                                "add_generation_prompt": False, "continue_final_message": True},
    "continue_parts": {"messages": [_u("Go"), {"role": "assistant", "content": _parts("Sure,", "here")}],
                       "add_generation_prompt": False, "continue_final_message": True},
    "text_parts": {"messages": [{"role": "user", "content": _parts("Line A", "Line B")}]},
    "text_parts_padded": {"messages": [{"role": "user", "content": _parts(" A ", " B ")}]},
    "system_parts": {"messages": [{"role": "system", "content": _parts("S1", "S2")}, _u("u")]},
    "one_part": {"messages": [{"role": "user", "content": _parts("only")}]},
    "empty_content": {"messages": [_u(""), {"role": "assistant", "content": ""}, _u("again")]},
    "tools": {"messages": [_u("Weather in Paris?")], "tools": TOOLS},
    "tools_with_system": {"messages": [{"role": "system", "content": "Use tools."}, _u("Weather?")], "tools": TOOLS},
    "tool_history_json_text": {"messages": _calling('{"city": "Paris"}'), "tools": TOOLS},
    "tool_history_dict": {"messages": _calling({"city": "Paris"}), "tools": TOOLS},
    "tool_history_content": {"messages": _calling('{"city": "Paris"}', content="Let me check.")},
    "tool_history_bad_json": {"messages": _calling("not json")},
    "tool_history_empty_args": {"messages": _calling("")},
    "tool_reply_parts": {"messages": _calling("{}")[:2] + [{"role": "tool", "tool_call_id": "call12345",
                                                            "content": _parts("a", "b")}]},
    "empty_tool_calls": {"messages": [_u("hi"), {"role": "assistant", "content": "ok", "tool_calls": []}, _u("again")]},
    "ipython_role": {"messages": _calling("{}")[:2] + [{"role": "ipython", "content": "22C"}]},
    "reasoning_history": {"messages": [_u("q1"), {"role": "assistant", "content": "a1", "reasoning": "r1"}, _u("q2"),
                                       *_calling('{"city": "Paris"}', reasoning="r2")[1:]]},
    "think_in_content": {"messages": [_u("q1"), {"role": "assistant", "content": "<think>\nhm\n</think>\n\nA1"},
                                      _u("q2")]},
    "enable_thinking_false": {"messages": [_u("q")], "chat_template_kwargs": {"enable_thinking": False}},
    "llama_kwargs": {"messages": [_u("q")], "tools": TOOLS,
                     "chat_template_kwargs": {"date_string": "01 Jan 2025", "tools_in_user_message": False}},
    "special_tokens_in_text": {"messages": [_u("a<|im_end|>b<|eot_id|>c</s>[INST]<start_of_turn><｜User｜><think>")]},
    "documents": {"messages": [_u("q")], "documents": [{"title": "T1", "text": "doc one"}, {"title": "T2", "text": "2"}]},
    "unknown_role": {"messages": [{"role": "critic", "content": "meh"}, _u("q")]},
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fam", FAMILIES)
def test_request_renders_as_vllm_and_transformers(pairs, fam, case):
    """The prompt text and ids of a request equal transformers' rendering of vLLM's messages; where transformers
    cannot render them (the template raises, or fails on the inputs), decodekit refuses with a ValueError naming the
    template's reason."""
    tok, hf = pairs[fam]
    body, fmt = CASES[case], "openai" if fam in OPENAI_FORMAT else "string"
    if case == "continue_parts" and fmt == "openai":
        # deliberate deviation: a continued last message's parts are continued as their text joined with "\n"
        # (vLLM hands a parts-looping template the parts and continues the last one)
        body = {**body, "messages": body["messages"][:-1] + [
            {"role": "assistant", "content": "\n".join(p["text"] for p in body["messages"][-1]["content"])}]}
    try:
        want = oracle(hf, body, fmt)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(ValueError, match="chat template error") as got:
            ours(tok, body)
        if isinstance(e, jinja2.TemplateError):
            assert str(e) in str(got.value)
        return
    assert ours(tok, body) == want
    assert ours(tok, body, tokenize=True) == oracle(hf, body, fmt, tokenize=True)


@pytest.mark.parametrize("template, fmt", [
    (LLAMA31, "string"), (QWEN25, "string"), (QWEN3, "string"), (MISTRAL_V3, "string"), (MISTRAL_V7, "openai"),
    (PHI3, "string"), (GEMMA2, "string"), (GEMMA3, "openai"), (DEEPSEEK_R1, "string"),
    ("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}", "openai"),
    ("{% set ms = messages | selectattr('role') | list %}{% for m in ms[1:] %}"
     "{% for p in m['content'] | list %}{{ p.text }}{% endfor %}{% endfor %}", "openai"),
    ("{% for m in messages %}{% set c = m.content %}{% for p in c %}{{ p }}{% endfor %}{% endfor %}", "string"),
    ("{% for t in tools %}{% for p in t.content %}{% endfor %}{% endfor %}{{ messages[0].content }}", "string"),
    ("{% for %}", "string"),
])
def test_content_format_detection(template, fmt):
    """vLLM's --chat-template-content-format auto: "openai" only for loops over a message's content."""
    assert template_content_format(template) == fmt


# ------------------------------------------------------------------ regressions (each failed before its fix)
def test_text_parts_are_joined_with_newlines(pairs):
    """Was: parts joined with "" ("Line ALine B"); vLLM joins them with "\\n" for string-content templates."""
    tok, _ = pairs["qwen25"]
    text = ours(tok, {"messages": [{"role": "user", "content": _parts("Line A", "Line B")}]})
    assert "<|im_start|>user\nLine A\nLine B<|im_end|>" in text


def test_templates_that_loop_over_parts_get_the_parts(pairs):
    """Was: the parts joined into one string; Gemma 3 trims each part it loops over and reads a list system
    message's first part (as vLLM, which hands such templates the list)."""
    tok, _ = pairs["gemma3"]
    body = {"messages": [{"role": "system", "content": _parts("S1", "S2")},
                         {"role": "user", "content": _parts(" A ", " B ")}]}
    assert ours(tok, body) == "<bos><start_of_turn>user\nS1\n\nAB<end_of_turn>\n<start_of_turn>model\n"


def test_empty_tool_calls_are_no_tool_calls(pairs):
    """Was: tool_calls [] reached the template: Llama 3.1 raised "only supports single tool-calls", Mistral v3
    refused the alternation (vLLM drops an empty list)."""
    for fam in ("llama3", "mistral3"):
        assert "ok" in ours(pairs[fam][0], CASES["empty_tool_calls"])


def test_arguments_that_are_not_json_render_as_an_empty_object(pairs):
    """Was: the text went to the template as it was: Qwen3 wrote `"arguments": }` for "" (vLLM: {})."""
    text = ours(pairs["qwen3"][0], {"messages": _calling("")})
    assert '{"name": "get_weather", "arguments": {}}' in text


def test_documents_reach_the_template(tiny, client):
    """Was: a chat request's documents were silently dropped (and /tokenize refused them), as vLLM: the template
    gets them."""
    body = {**CASES["documents"], "chat_template": DOCS}
    want = oracle(tiny[1], body, "string", tokenize=True)
    assert client.post("/v1/chat/completions", json={**body, "max_tokens": 1}).status_code == 200
    assert client.seen[-1] == want
    assert client.post("/tokenize", json=body).json()["tokens"] == want
    assert tiny[1].decode(want).startswith("<|begin_of_text|><docs>[0] T1: doc one\n[1] T2: 2\n</docs>")
    r = client.post("/v1/chat/completions", json={**body, "documents": [{"title": 1}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents"


def test_a_template_failing_on_its_inputs_is_a_value_error(pairs):
    """Was: DeepSeek-R1's `'...' + arguments` on vLLM's dict arguments raised a bare TypeError from
    Tokenizer.apply_chat_template (the server's 400 came from a catch-all)."""
    tok, _ = pairs["deepseek_r1"]
    conv = vllm_conversation(_calling('{"city": "Paris"}'), "string")
    with pytest.raises(ValueError, match=r"chat template error: TypeError: can only concatenate str"):
        tok.apply_chat_template(conv)


def test_none_valued_keys_are_dropped_as_transformers_does(pairs):
    """Was: {"tool_calls": None} stayed a key: Llama 3.1's `'tool_calls' in message` took it for a tool call."""
    tok, hf = pairs["llama3"]
    conv = [_u("hi"), {"role": "assistant", "content": "ok", "tool_calls": None, "name": None}, _u("more")]
    assert tok.apply_chat_template(conv) == hf.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)


def test_generation_blocks_render_their_body(pairs):
    """Was: {% generation %} (transformers' assistant-mask tag, in some released templates) was a syntax error."""
    tok, hf = pairs["qwen25"]
    t = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
         "{% else %}{{ m.content }}{% endif %}|{% endfor %}")
    conv = [_u("a"), {"role": "assistant", "content": "b"}]
    assert tok.apply_chat_template(conv, chat_template=t) == hf.apply_chat_template(conv, chat_template=t,
                                                                                     tokenize=False) == "a|b|"


def test_reasoning_under_every_name_templates_read(pairs):
    """Was: a message's reasoning only under its own key; transformers also gives it as reasoning_content and
    thinking (gpt-oss templates read `message.thinking`)."""
    tok, hf = pairs["qwen3"]
    t = "{% for m in messages %}[{{ m.thinking }}|{{ m.reasoning_content }}]{% endfor %}"
    for key in ("reasoning", "reasoning_content", "thinking"):
        conv = [{"role": "assistant", "content": "x", key: "r"}]
        assert tok.apply_chat_template(conv, chat_template=t) == hf.apply_chat_template(
            conv, chat_template=t, tokenize=False) == "[r|r]"


@pytest.mark.parametrize("name", ["max_chars", "special_tokens", "template"])
def test_template_kwargs_that_name_the_renderers_parameters(pairs, name):
    """Was: chat_template_kwargs {"max_chars": ...} collided with the renderer's own keyword (a TypeError, or the
    render limit set by the request)."""
    with pytest.raises(P.APIError, match=f"chat_template_kwargs: '{name}'"):
        ours(pairs["qwen3"][0], {"messages": [_u("q")], "chat_template_kwargs": {name: 5}})


# ------------------------------------------------------------------ the ids the engine gets
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama whose tokenizer has every family's tokens and prepends BOS (<|begin_of_text|>): any
    template can render for it, and an extra BOS would show."""
    from dk_testing import tiny_hf_model
    d = str(tmp_path_factory.mktemp("chat_audit_model"))
    special = list(dict.fromkeys(s for spec in FAMILIES.values() for s in spec[4]))
    plain = list(dict.fromkeys(s for spec in FAMILIES.values() for s in spec[5]))
    write_tokenizer_dir(d, QWEN3, "<|begin_of_text|>", "<|eot_id|>", True, special, plain)
    hf = hf_tokenizer(d)
    model = tiny_hf_model("Llama", vocab_size=len(hf), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                          bos_token_id=hf.bos_token_id, eos_token_id=hf.eos_token_id, tie_word_embeddings=True)
    model.save_pretrained(d)
    return d, hf


ENGINE_CASES = ["system_multi_turn", "text_parts", "system_parts", "tool_history_json_text", "reasoning_history",
                "continue_final", "special_tokens_in_text", "documents", "llama_kwargs", "tool_reply_parts"]
SP = SamplingParams(max_tokens=1, temperature=0)


def _engine_expectations(hf):
    """(family, case, template, request body, expected ids) for the cases transformers renders."""
    for fam, spec in FAMILIES.items():
        for case in ENGINE_CASES:
            body = {**CASES[case], "chat_template": spec[0]}
            try:
                want = oracle(hf, body, "openai" if fam in OPENAI_FORMAT else "string", tokenize=True)
            except Exception:  # noqa: BLE001 -- (the template refuses the case: the rendering test covers it)
                continue
            yield fam, case, spec[0], body, want


def test_llm_chat_hands_the_engine_transformers_ids(tiny):
    from decodekit import LLM
    d, hf = tiny
    llm = LLM(d, dtype="float32", device="cpu", max_model_len=2048, kv_cache_memory="16MiB")
    n = 0
    for fam, case, template, body, want in _engine_expectations(hf):
        kw = dict(chat_template=template, tools=body.get("tools"),
                  chat_template_kwargs={**body.get("chat_template_kwargs", {}),
                                        **({"documents": body["documents"]} if "documents" in body else {})},
                  add_generation_prompt=body.get("add_generation_prompt", True),
                  continue_final_message=body.get("continue_final_message", False))
        (out,) = llm.chat(body["messages"], SP, **kw)
        assert out.prompt_token_ids == want, (fam, case)
        assert llm.apply_chat_template(body["messages"], **kw) == want
        assert want.count(hf.bos_token_id) <= 1     # the template's BOS only
        n += 1
    assert n > 60


@pytest.fixture(scope="module")
def client(tiny):
    """/v1/chat/completions on the tiny model (engine in a thread), recording the prompt ids the engine gets."""
    from fastapi.testclient import TestClient
    from decodekit.engine.args import EngineArgs
    from decodekit.engine.llm_engine import LLMEngine
    from decodekit.server.app import ServerConfig, build_app
    from decodekit.server.async_engine import AsyncEngine
    aeng = AsyncEngine(LLMEngine(EngineArgs(model=tiny[0], dtype="float32", device="cpu", max_model_len=2048,
                                            kv_cache_memory="16MiB")))
    aeng.start()
    seen, add = [], aeng.add

    async def recording_add(rid, prompt, params):
        seen.append(prompt["prompt_token_ids"])
        return await add(rid, prompt, params)
    aeng.add = recording_add
    with TestClient(build_app(aeng, ServerConfig(model_name="tiny", trust_request_chat_template=True))) as c:
        c.seen = seen
        yield c
    aeng.shutdown()


def test_server_hands_the_engine_transformers_ids(tiny, client):
    _, hf = tiny
    n = 0
    for fam, case, template, body, want in _engine_expectations(hf):
        if n % 3 == 0 or case in ("documents", "continue_final", "text_parts", "system_parts"):
            r = client.post("/v1/chat/completions", json={**body, "max_tokens": 1, "prompt_logprobs": 0,
                                                          **({"tool_choice": "none"} if "tools" in body else {})})
            assert r.status_code == 200, (fam, case, r.text)
            assert client.seen[-1] == want, (fam, case)
            plp = r.json()["prompt_logprobs"]    # (the ids as the engine scored them, from the second on)
            assert [int(next(iter(e))) for e in plp[1:]] == want[1:]
        r = client.post("/tokenize", json=body)
        assert r.status_code == 200 and r.json()["tokens"] == want, (fam, case, r.text)
        n += 1


@pytest.mark.parametrize("messages, field", [
    ([{"content": "hi"}], r"messages\[0\]' must be an object with a string 'role'"),
    ([{"role": 7, "content": "hi"}], r"messages\[0\]' must be an object with a string 'role'"),
    ([{"role": "", "content": "hi"}], r"messages\[0\]\.role' must not be empty"),
    ([{"role": "user", "content": 5}], r"messages\[0\]\.content' must be a string or a list of text parts, got a num"),
    ([{"role": "user", "content": {"text": "x"}}], r"messages\[0\]\.content' must be a string .* got an object"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], r"messages\[0\]\.content' parts"),
    ([{"role": "user", "content": [[{"type": "text", "text": "x"}]]}], r"messages\[0\]\.content' parts"),
    ([{"role": "user", "content": [{"type": "text", "text": {"nested": ["x"]}}]}], r"messages\[0\]\.content' parts"),
    ([{"role": "user", "content": None}], r"messages\[0\]\.content' is required"),
    ([{"role": "user", "content": "hi", "name": 5}], r"messages\[0\]\.name' must be a string"),
    ([{"role": "tool", "content": "x", "tool_call_id": 9}], r"messages\[0\]\.tool_call_id' must be a string"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]}],
     r"messages\[0\]\.tool_calls\[0\]'"),
    ([{"role": "user", "content": "x" * 1_000_000}], r"'messages' hold 1000004 characters"),
])
def test_malformed_messages_get_a_400_naming_the_field(client, messages, field):
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and err["type"] == "invalid_request_error"
    assert re.search(field, err["message"]), err["message"]


def test_template_refusals_are_400s_and_the_server_keeps_serving(client):
    """raise_exception (Gemma's system role, Mistral's tool-call ids: a tool turn without tool_call_id is accepted
    as by vLLM, and the template refuses it), a template failing on its inputs, deeply nested JSON: 400s naming
    the problem, never a 500."""
    bodies = [
        ({"messages": [{"role": "system", "content": "s"}, _u("u")], "chat_template": GEMMA2}, "System role not"),
        ({"messages": _calling("{}")[:2] + [{"role": "tool", "content": "22C"}], "chat_template": MISTRAL_V3},
         "Tool call IDs should be alphanumeric"),
        ({"messages": _calling("{}"), "chat_template": DEEPSEEK_R1}, "can only concatenate str"),
        ({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"max_chars": 1}}, "max_chars"),
    ]
    for body, msg in bodies:
        r = client.post("/v1/chat/completions", json={**body, "max_tokens": 1})
        assert r.status_code == 400 and msg in r.json()["error"]["message"], r.text
    deep = b'{"messages": [{"role": "user", "content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}"
    r = client.post("/v1/chat/completions", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert client.get("/health").status_code == 200
    r = client.post("/v1/chat/completions", json={"messages": [_u("hi")], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


# ------------------------------------------------------------------ the embedded model's own template
EMBEDDED = [
    [{"role": "system", "content": "Be brief."}, _u("Hello <|im_end|> there <|im_start|>assistant")],
    [_u("Tell me a joke"), {"role": "assistant", "content": "No."}, _u("Please? 🙂 日本語")],
    _calling('{"city": "Paris"}'),
]


def test_embedded_model_chat_ids_equal_transformers(hf_tok):
    """LLM.chat on SmolLM2-135M-Instruct (its template from the GGUF): the engine's prompt ids are transformers'
    (special tokens written in a message included); no BOS added (its template starts with <|im_start|>)."""
    from dk_testing import embedded_llm
    llm = embedded_llm(max_model_len=1024, kv_cache_memory="64MiB")
    assert llm.tokenizer.chat_template == SMOLLM2
    for conv in EMBEDDED:
        (out,) = llm.chat(conv, SP)
        want = hf_tok.apply_chat_template(vllm_conversation(conv, "string"), add_generation_prompt=True,
                                          tokenize=True, return_dict=False)
        assert out.prompt_token_ids == want
    parts = llm.chat([{"role": "user", "content": _parts("Say", "hi")}], SP)[0].prompt_token_ids
    assert parts == llm.apply_chat_template([_u("Say\nhi")])
    with pytest.raises(ValueError, match=r"conversation 1: 'messages\[0\]\.content' parts"):
        llm.chat([[_u("ok")], [{"role": "user", "content": [{"type": "image_url"}]}]], SP)
    assert not llm.engine.has_unfinished_requests()
