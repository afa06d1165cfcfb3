/*
 * gwwire.h — the kernel WebSocket's message forms (what Jupyter Server and
 * Kernel Gateway speak on /api/kernels/ID/channels), to and from jmsg.
 *
 * Two forms, chosen per connection by the WebSocket subprotocol:
 *   GW_FORM_JSON  no subprotocol: a text frame holds one JSON object
 *                 {header, parent_header, metadata, content, channel, buffers?,
 *                 msg_id, msg_type}; a message with binary buffers travels as
 *                 a binary frame: u32be nbufs, nbufs u32be offsets, the JSON
 *                 (without "buffers"), then the buffers (jupyter_server's
 *                 serialize_binary_message).
 *   GW_FORM_V1    "v1.kernel.websocket.jupyter.org": binary frames of
 *                 u64le offset count, u64le offsets, the channel name, then
 *                 header, parent_header, metadata, content (JSON) and buffers.
 *
 * Everything decoded comes from the network: sizes, offsets, UTF-8 and JSON
 * are checked and a reason is given for anything refused. Signatures are not
 * part of either form: the relay signs for the kernel (the key never leaves
 * the host side).
 */
#ifndef KERNELMGR_GWWIRE_H
#define KERNELMGR_GWWIRE_H

#include "kernelmgr/engine/kmerr.h"

#include "jp.h"

#define GW_SUBPROTOCOL_V1 "v1.kernel.websocket.jupyter.org"

typedef enum gw_form { GW_FORM_JSON = 0, GW_FORM_V1 } gw_form;

/* Decodes one WebSocket message of len bytes (binary: a binary frame).
 * Accepted channels: shell, control, stdin (a client never sends on iopub or
 * hb); an absent channel in the JSON form means shell, as in jupyter_server.
 * header needs msg_id and msg_type (strings); parent_header, metadata and
 * content default to {} and must be objects. 0 with *out new and *ch set, or
 * -1 with a reason in err. */
int gwwire_decode(gw_form form, int binary, const void *data, size_t len, jp_channel *ch,
                  jmsg **out, km_err *err);

/* Encodes msg (borrowed), received from the kernel on ch, for the client.
 * *out is new (free()), *len its size, *binary whether it must go as a
 * binary frame. 0, or -1 when out of memory / the JSON cannot be written. */
int gwwire_encode(gw_form form, jp_channel ch, const jmsg *msg, unsigned char **out, size_t *len,
                  int *binary);

#endif
