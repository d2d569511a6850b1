"""The sidebar's events: saved chats kept in the browser, new chat, open, rename, delete, export and import.

After every turn (and Undo) the open chat is saved; a reload lists the saved chats and reopens the newest.
"""

from __future__ import annotations

import gradio as gr

from vlchat.app import ui_chats
from vlchat.app.errors import is_user_error
from vlchat.app.settings import MediaLimits
from vlchat.app.ui_history import from_openai, to_openai

PRIVATE = dict(api_visibility="private", queue=False)


def _listing(store, chat_id):
    return gr.Radio(choices=ui_chats.choices(store), value=chat_id)


def _export(store, chat_id):
    if ui_chats.find(store, chat_id) is None:
        return gr.DownloadButton(value=None, interactive=False)
    return gr.DownloadButton(value=ui_chats.export_file(store, chat_id), interactive=True)


def _refuse(exc: Exception) -> None:
    if not is_user_error(exc):
        raise exc
    gr.Warning(str(exc))


def wire_sidebar(ui, sidebar: dict, store, chat_id, chatbot, textbox, limits: MediaLimits, after: list) -> None:
    chats, export = sidebar["chats"], sidebar["export"]
    listing = [store, chat_id, chats, export]

    def persist(history, stored, current):
        try:
            stored, current = ui_chats.save(stored, current, to_openai(history, limits))
        except Exception as exc:
            _refuse(exc)
            return gr.MultimodalTextbox(interactive=True, submit_btn=True, stop_btn=False), *[gr.skip()] * 4
        idle = gr.MultimodalTextbox(interactive=True, submit_btn=True, stop_btn=False)
        return idle, stored, current, _listing(stored, current), _export(stored, current)

    for event in after:
        event.then(persist, [chatbot, store, chat_id], [textbox, *listing], **PRIVATE)

    def open_chat(stored, picked):
        chat = ui_chats.find(stored, picked)
        if chat is None:
            return [], None, _listing(stored, None), _export(stored, None)
        try:
            history = from_openai(chat["messages"], limits)
        except Exception as exc:
            _refuse(exc)
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return history, picked, _listing(stored, picked), _export(stored, picked)

    def reopen(stored):
        newest = ui_chats.chats(stored)[0]["id"] if ui_chats.chats(stored) else None
        return open_chat(stored, newest)

    ui.load(reopen, [store], [chatbot, chat_id, chats, export], **PRIVATE)
    chats.input(open_chat, [store, chats], [chatbot, chat_id, chats, export], **PRIVATE)

    def new_chat(stored):
        return [], None, _listing(stored, None), _export(stored, None), gr.MultimodalTextbox(value=None)

    sidebar["new"].click(new_chat, [store], [chatbot, chat_id, chats, export, textbox], **PRIVATE)
    # The chat's own Clear starts a new chat too; the cleared one stays saved in the list.
    chatbot.clear(lambda stored: new_chat(stored)[1:4], [store], [chat_id, chats, export], **PRIVATE)

    def rename(stored, current, title):
        try:
            stored = ui_chats.rename(stored, current, title)
        except Exception as exc:
            _refuse(exc)
            return (gr.skip(),) * 4
        return stored, _listing(stored, current), "", _export(stored, current)

    renamed = [store, chats, sidebar["title"], export]
    sidebar["title"].submit(rename, [store, chat_id, sidebar["title"]], renamed, **PRIVATE)

    def delete(stored, current):
        stored = ui_chats.delete(stored, current)
        return stored, [], None, _listing(stored, None), _export(stored, None)

    sidebar["delete"].click(delete, [store, chat_id], [store, chatbot, chat_id, chats, export], **PRIVATE)

    def import_chat(stored, path):
        try:
            title, messages = ui_chats.read_import(path, limits.max_image_bytes * limits.max_images_per_request)
            history = from_openai(messages, limits)
            stored, current = ui_chats.save(stored, None, to_openai(history, limits))
            if title:
                stored = ui_chats.rename(stored, current, title)
        except Exception as exc:
            _refuse(exc)
            return (gr.skip(),) * 5
        return stored, history, current, _listing(stored, current), _export(stored, current)

    sidebar["load"].upload(import_chat, [store, sidebar["load"]], [store, chatbot, chat_id, chats, export], **PRIVATE)
