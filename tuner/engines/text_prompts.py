"""Text prompts for engines that take no token ids: one common English word per token id.

The same ids always give the same words, so shared prefixes and session history stay shared; these
words are one token each, with their leading space, in SmolLM2's vocabulary (2,000 random ones are
2,000 tokens) and nearly so in other BPE vocabularies, so a prompt of N ids is close to N tokens.
The server's own count of each prompt is kept (`ServerTimings`), and `prompt_token_ratio` reports how
close the replay came.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["WORDS", "ids_to_text"]

_WORD_LIST = """
    the of and to in is was for that on with as by at from his an be this which are or had not but have
    one were her all she there their been has when who will more no if out so said what up its about
    than into them can only other new some could time these two may then do first any my now such like
    our over man me even most made after also did many before must through back years where much your
    way well down should because each just those people how too little state good very make world still
    own see men work long get here between both life being under never day same another know while last
    might us great old year off come since against go came right used take three states himself few
    house use during without again place american around however home small found thought went say part
    once general high upon school every don does got united left number course war until always away
    something fact though water less public put think almost hand enough far took head yet government
    system better set told nothing night end why called didn find going look asked later point knew city
    next program business give group toward days young let room president side social given present
    several order national possible rather second face per among form important often things looked
    early white case john become large big need four within felt along children saw best church ever
    least power development light thing seemed family interest want members mind country area others
    done turned although open god service problem certain kind different thus began door help means
    sense whole matter perhaps itself times law human line above name example action company hands
    local show five history whether gave either act today feet across taken past quite anything seen
    having death week experience body word half really field am car words already themselves information
    tell together college shall money period held keep sure probably free real seems behind cannot miss
    political air question making office brought whose special heard major problems ago became federal
    moment study available known result street economic boy position reason change south board
    individual job society areas west close turn love community true court force full seem front art
    wife care women wanted
"""
WORDS: tuple[str, ...] = tuple(_WORD_LIST.split())


def ids_to_text(ids: Sequence[int]) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in ids)
